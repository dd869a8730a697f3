"""Where a calibration measures, and what a finished calibration was measured on.

The probes must measure what training will run, so the choices here follow the engine's
own (:func:`~lightning_embark.engine.engine_placement`): on the CPU, gloo
process groups and the ``auto`` store (fbgemm's CPU kernels where they load); on CUDA,
NCCL groups and the torch store on the GPU. Kept apart from the probes, and free of any
process group or GPU, so that CPU tests check the CUDA choices too.

CUDA kernels and NCCL collectives return before the device has finished them, so a
host clock read right after one times the launch, not the work. Every clock read of the
probes therefore goes through :func:`timer`, which synchronizes the device first (on
the CPU it is the plain clock, as before).

A calibration measured on one kind of device prices another badly (CPU lookups cost
about a hundred times an H100's), so :func:`calibration_device` reads back which kind a
calibration describes and :func:`check_calibration_device` refuses or warns, naming both,
when it is used to plan a run on the other kind.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from lightning_embark.errors import ConfigError

if TYPE_CHECKING:
    import torch

    from lightning_embark.planner import Calibration

log = logging.getLogger(__name__)

#: ``embark-calibrate --device`` choices.
DEVICE_CHOICES = ("auto", "cpu", "cuda")

#: The device type each process-group backend measures (the engine's pairing).
BACKEND_DEVICES = {"gloo": "cpu", "nccl": "cuda"}

_MEASURED = re.compile(r"^measured: (?:embark-calibrate, |links )(gloo|nccl)\b")


def resolve_device(choice: str, *, cuda_available: bool) -> str:
    """The device type ``--device choice`` measures: ``auto`` is ``cuda`` where a GPU is
    visible, else ``cpu``.

    Raises:
        ConfigError: an unknown choice, or ``cuda`` without a visible GPU (the run would
            otherwise fail inside every rank, far from the option that caused it).
    """
    if choice not in DEVICE_CHOICES:
        raise ConfigError(f"--device must be one of {list(DEVICE_CHOICES)}, got {choice!r}")
    if choice == "auto":
        return "cuda" if cuda_available else "cpu"
    if choice == "cuda" and not cuda_available:
        raise ConfigError(
            "--device cuda, but torch sees no CUDA device here; run on the GPU machine, or "
            "use --device cpu"
        )
    return choice


def probe_placement(device: torch.device | str) -> Any:
    """The engine's placement on ``device``: its backend and store kernel, which the
    probes then use (an :class:`~lightning_embark.engine.EnginePlacement`).

    Raises:
        ConfigError: a device the engine does not run on (names it).
    """
    import torch

    from lightning_embark.engine import engine_placement

    return engine_placement(torch.device(device))


def probe_backend(device: torch.device | str) -> str:
    """The process-group backend the probes use on ``device``: ``gloo`` on the CPU,
    ``nccl`` on CUDA, as the engine's exchanges use."""
    return str(probe_placement(device).backend)


def probe_store(device: torch.device | str) -> str:
    """The embedding store kernel the lookup probes use on ``device``: the engine's
    (``auto`` on the CPU, ``torch`` on CUDA)."""
    return str(probe_placement(device).store)


def sync_hook(device: torch.device | str) -> Callable[[], None] | None:
    """What to call before reading the clock on ``device``: ``torch.cuda.synchronize``
    of that device on CUDA, nothing on the CPU (its work is done when the call returns).

    Raises:
        ConfigError: a device type the probes do not run on.
    """
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return None
    if device.type == "cuda":
        return functools.partial(torch.cuda.synchronize, device)
    raise ConfigError(f"embark-calibrate measures on cpu or cuda devices, not on {device}")


def timer(
    device: torch.device | str, *, sync: Callable[[], None] | None = None
) -> Callable[[], float]:
    """A clock for timing work on ``device``: seconds after the device's queued work is
    done.

    Args:
        device: Where the timed work runs.
        sync: What waits for that work; default :func:`sync_hook` of ``device`` (tests
            inject their own).

    Returns:
        ``time.perf_counter`` itself on the CPU (no hook), else a clock that calls the
        hook and then reads ``perf_counter``.
    """
    hook = sync if sync is not None else sync_hook(device)
    if hook is None:
        return time.perf_counter

    def now() -> float:
        hook()
        return time.perf_counter()

    return now


def calibration_device(calib: Calibration) -> str | None:
    """The device type a calibration's figures describe: ``cpu`` or ``cuda``, or None
    when its ``source`` does not say (a hand-written file).

    Measured calibrations name their backend (``measured: embark-calibrate, nccl ...``,
    or the ``emulated`` preset's ``measured: links gloo ...``); datasheet presets
    (``datasheet: ...``) describe GPUs.
    """
    source = calib.source.strip()
    found = _MEASURED.match(source)
    if found:
        return BACKEND_DEVICES[found.group(1)]
    if source.startswith("datasheet:"):
        return "cuda"
    return None


def check_calibration_device(
    calib: Calibration, device: torch.device | str, *, strict: bool = False
) -> str | None:
    """Refuse or warn when ``calib`` was made for another kind of device than the run
    it plans (on ``device``): its lookup, codec and link figures would be off by orders
    of magnitude, and the planner would rank plans by the wrong costs.

    Args:
        calib: The calibration the planner is about to use.
        device: The planned run's device (``cpu``, ``cuda`` or ``cuda:<i>``).
        strict: Raise instead of warning.

    Returns:
        The warning's text, or None when the kinds agree or the calibration does not say.

    Raises:
        ConfigError: ``strict`` and the kinds differ (names both).
    """
    import torch

    measured = calibration_device(calib)
    wanted = torch.device(device).type
    if measured is None or measured == wanted:
        return None
    backend = {v: k for k, v in BACKEND_DEVICES.items()}
    message = (
        f"calibration {calib.name!r} describes {measured} ranks "
        f"({backend.get(measured, '?')}), but the run it plans is on {wanted} "
        f"({backend.get(wanted, '?')}); its figures misprice every plan there. Calibrate on "
        f"the run's hardware (embark-calibrate --device {wanted}) or use a preset of it"
    )
    if strict:
        raise ConfigError(message)
    log.warning("%s", message)
    return message
