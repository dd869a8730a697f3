"""Where calibration measures: backend and store per device, a clock that waits for the
device, and which device a finished calibration describes. All on the CPU: a CUDA device
object is only a choice here, and the synchronization hook is injected."""

from __future__ import annotations

import functools
import time

import pytest
import torch

from lightning_embark.calibration import _device
from lightning_embark.calibration._device import (
    calibration_device,
    check_calibration_device,
    probe_backend,
    probe_store,
    resolve_device,
    sync_hook,
    timer,
)
from lightning_embark.calibration._timing import time_repeats, timed
from lightning_embark.errors import ConfigError
from lightning_embark.planner._hardware import Calibration, load_calibration

CUDA0 = torch.device("cuda", 0)


def test_resolve_device_auto_follows_the_visible_gpus() -> None:
    assert resolve_device("auto", cuda_available=True) == "cuda"
    assert resolve_device("auto", cuda_available=False) == "cpu"
    assert resolve_device("cpu", cuda_available=True) == "cpu"
    assert resolve_device("cuda", cuda_available=True) == "cuda"
    with pytest.raises(ConfigError, match="no CUDA device"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(ConfigError, match="--device must be one of"):
        resolve_device("mps", cuda_available=True)


def test_probes_use_the_engines_backend_and_store_per_device() -> None:
    """gloo and the ``auto`` store on the CPU, NCCL and the torch store on CUDA: what the
    engine's placement picks, so the calibration measures what training runs."""
    assert probe_backend("cpu") == "gloo" and probe_store("cpu") == "auto"
    assert probe_backend(CUDA0) == "nccl" and probe_store(CUDA0) == "torch"
    with pytest.raises(ConfigError, match="mps"):
        probe_backend(torch.device("mps"))


def test_sync_hook_is_cuda_synchronize_of_that_device_and_nothing_on_cpu() -> None:
    assert sync_hook("cpu") is None
    hook = sync_hook(CUDA0)
    assert isinstance(hook, functools.partial)
    assert hook.func is torch.cuda.synchronize and hook.args == (CUDA0,)
    with pytest.raises(ConfigError, match="cpu or cuda"):
        sync_hook(torch.device("meta"))


def test_timer_syncs_before_every_clock_read(monkeypatch: pytest.MonkeyPatch) -> None:
    """An async kernel is only done after the sync: the hook must run before each read."""
    assert timer("cpu") is time.perf_counter
    events: list[str] = []
    ticks = iter(range(100))

    def fake_clock() -> float:
        events.append("read")
        return float(next(ticks))

    monkeypatch.setattr(_device.time, "perf_counter", fake_clock)
    clock = timer(CUDA0, sync=lambda: events.append("sync"))
    assert clock() == 0.0 and clock() == 1.0
    assert events == ["sync", "read", "sync", "read"]


def test_timing_helpers_read_the_given_clock() -> None:
    """Each repeat lasts two ticks of the injected clock (read before and after, the
    clock counts the reads), so the probes' figures come from it, not perf_counter."""
    reads = iter(range(1000))

    def clock() -> float:
        return float(next(reads)) * 2.0

    assert time_repeats(lambda: None, repeats=3, clock=clock) == 2.0
    assert timed(lambda: None, clock) == 2.0


def test_calibration_device_reads_the_presets_sources() -> None:
    """Datasheet presets describe GPUs, the emulated preset gloo ranks; a hand-written
    file that does not say is not judged."""
    assert calibration_device(load_calibration("dgx-h100")) == "cuda"
    assert calibration_device(load_calibration("emulated")) == "cpu"
    unknown = Calibration(intra_bandwidth=1.0, inter_bandwidth=1.0, lookup_bandwidth=1.0)
    assert calibration_device(unknown) is None
    assert check_calibration_device(unknown, CUDA0, strict=True) is None


def test_a_gpu_preset_planning_a_cpu_run_is_refused_naming_both() -> None:
    assert check_calibration_device(load_calibration("dgx-h200"), "cuda:1", strict=True) is None
    with pytest.raises(ConfigError, match=r"describes cuda ranks \(nccl\).*on cpu \(gloo\)"):
        check_calibration_device(load_calibration("dgx-h200"), "cpu", strict=True)
