"""Measuring the cost model's constants on the cluster at hand (``embark-calibrate``).

* ``_probes`` (with ``_link_probes``, ``_compute_probes``, ``_timing``): the
  measurements, inside a process group (every rank calls them): links, all-reduce,
  hierarchical exchanges, lookups, codecs, the engine on a tiny batch.
* ``_fit``: pure fitting of those measurements (links, lookups, the hierarchical stage,
  each fit's quality); ``_from_measurements`` builds a
  :class:`~lightning_embark.planner.Calibration` from them.
* ``_worker``: the per-rank script ``embark-calibrate`` launches under torchrun.
* ``_device``: where the probes measure (gloo on the CPU, NCCL on CUDA, the engine's
  store), a clock that waits for the device, and which device a finished calibration
  describes (:func:`check_calibration_device` for the planner's side).

Calibration measures the engine; planning does not: the planner reads only the
resulting constants.
"""

from lightning_embark.calibration._device import (
    BACKEND_DEVICES,
    DEVICE_CHOICES,
    calibration_device,
    check_calibration_device,
    probe_backend,
    probe_store,
    resolve_device,
    sync_hook,
    timer,
)
from lightning_embark.calibration._fit import (
    POOR_FIT_REL_RMS,
    LinkFit,
    LookupFit,
    fit_alpha_beta,
    fit_lookup,
    hierarchical_efficiency,
    spearman,
    warn_poor_fits,
)
from lightning_embark.calibration._from_measurements import build_calibration
from lightning_embark.calibration._from_study import Refit, StudyPoint, refit, refit_study
from lightning_embark.calibration._probes import DEFAULT_SIZES, measure_all
from lightning_embark.calibration._worker import (
    machine_memory_per_rank,
    parse_sizes,
    worker_script,
)

__all__ = [
    "BACKEND_DEVICES",
    "DEFAULT_SIZES",
    "DEVICE_CHOICES",
    "POOR_FIT_REL_RMS",
    "LinkFit",
    "LookupFit",
    "Refit",
    "StudyPoint",
    "build_calibration",
    "calibration_device",
    "check_calibration_device",
    "fit_alpha_beta",
    "fit_lookup",
    "hierarchical_efficiency",
    "machine_memory_per_rank",
    "measure_all",
    "parse_sizes",
    "probe_backend",
    "probe_store",
    "refit",
    "refit_study",
    "resolve_device",
    "spearman",
    "sync_hook",
    "timer",
    "warn_poor_fits",
    "worker_script",
]
