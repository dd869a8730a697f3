"""The link rate of a headline row, chosen by a pilot run of the baseline.

On real clusters the baseline (``torchrec-twrw``) spends 25-50% of its step in embedding
exchange; on the emulated cluster that share depends on the shaped link's rate. A short
pilot run at a start rate measures the share, and :func:`pilot_rate` scales the rate so
that the share lands in the middle of that band. ``--rate-mbit`` skips the pilot; the
compute-bound row keeps the emulation's default rate.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .progress import log
from .runs import RunSettings, run_one
from .workloads import Workload

#: The emulation's accepted link rates (``EmulationConfig.rate_mbit``: 0.001..1,000,000).
RATE_MIN_MBIT = 0.001
RATE_MAX_MBIT = 1_000_000.0
#: The default link rate of the emulation (``lightning_embark.emulation.DEFAULT_RATE_MBIT``).
DEFAULT_RATE_MBIT = 800.0
#: The share of ``torchrec-twrw``'s step the pilot aims its rate at (the middle of 25-50%).
TARGET_SHARE = 0.375
#: The band the measured baseline share should land in.
SHARE_BAND = (0.25, 0.50)


def pilot_rate(
    rate_mbit: float,
    share: float,
    *,
    target: float = TARGET_SHARE,
    low: float = RATE_MIN_MBIT,
    high: float = RATE_MAX_MBIT,
) -> float:
    """The link rate at which the baseline should spend ``target`` of its step in exchange.

    Model: a step of ``T`` at rate ``r`` spends ``E = s T`` in the embedding exchange, whose
    time scales as ``1 / rate``, and ``C = (1 - s) T`` in everything else, which does not
    depend on the rate. The share is ``target`` when ``E* = target / (1 - target) * C``, at
    rate ``r* = r E / E*``::

        r* = r * s * (1 - target) / (target * (1 - s))

    clamped to ``[low, high]`` (the emulation's range). ``s >= 1`` (nothing but exchange)
    gives ``high``: no finite rate leaves room for anything else.

    Raises:
        ValueError: ``share <= 0`` (no exchange measured: no rate can set its share) or a
            ``target`` outside ``(0, 1)``.
    """
    if not 0 < target < 1:
        raise ValueError(f"target share must be within (0, 1), got {target}")
    if share <= 0:
        raise ValueError(
            f"the pilot measured an exchange share of {share}; no link rate scales a zero "
            "exchange: give the rate with --rate-mbit MODEL=RATE"
        )
    if share >= 1:
        return high
    chosen = rate_mbit * share * (1 - target) / (target * (1 - share))
    return min(high, max(low, chosen))


def choose_rate(
    workload: Workload,
    model: str,
    *,
    override: float | None,
    start_rate: float,
    pilot_steps: int,
    pilot_warmup: int,
    target: float,
    settings: RunSettings,
    runner: Callable[..., dict[str, Any]] = run_one,
) -> tuple[float | None, str, dict[str, Any] | None]:
    """The workload's link rate, where it came from, and the pilot's record (if one ran).

    ``--rate-mbit`` overrides; the compute-bound row keeps the default rate; a comm-bound
    row runs ``torchrec-twrw`` briefly at ``start_rate`` and takes :func:`pilot_rate` of
    its measured share. On loopback there is no rate to choose.
    """
    if settings.loopback:
        return None, "loopback: no shaped link", None
    if override is not None:
        return override, "--rate-mbit", None
    if not workload.pilot:
        return DEFAULT_RATE_MBIT, "default (compute-bound row)", None
    log(f"{workload.key}: pilot torchrec-twrw at {start_rate:g} Mbit/s")
    run = runner(
        workload,
        model,
        "torchrec-twrw",
        rate_mbit=start_rate,
        settings=settings,
        steps=pilot_steps,
        warmup=pilot_warmup,
    )
    pilot: dict[str, Any] = {
        "start_rate_mbit": start_rate,
        "share": run["comm_share"],
        "step_ms": run["step_time_ms"]["median"],
        "target": target,
        "steps": pilot_steps,
        "warmup": pilot_warmup,
    }
    if run["rate_mbit"] is None:
        log(f"{workload.key}: the pilot ran on loopback (no namespaces); no rate to choose")
        pilot["rate_mbit"] = None
        return None, "loopback fallback: no shaped link", pilot
    try:
        rate = pilot_rate(start_rate, run["comm_share"], target=target)
    except ValueError as error:
        log(f"{workload.key}: {error}; keeping {start_rate:g} Mbit/s")
        pilot["rate_mbit"] = start_rate
        return start_rate, "pilot (zero share: start rate kept)", pilot
    pilot["rate_mbit"] = rate
    log(
        f"{workload.key}: pilot share {run['comm_share']:.0%} at {start_rate:g} Mbit/s "
        f"-> {rate:.4g} Mbit/s for {target:.1%}"
    )
    return rate, f"pilot: {run['comm_share']:.0%} at {start_rate:g}", pilot
