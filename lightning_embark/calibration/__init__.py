"""Measuring the cost model's constants on the cluster at hand (``embark-calibrate``).

* :mod:`.probes`: the measurements, inside a process group (every rank calls them):
  links, all-reduce, hierarchical exchanges, lookups, codecs, the engine on a tiny batch.
* :mod:`.fit`: pure fitting of those measurements into a
  :class:`~lightning_embark.planner._hardware.Calibration`; run as a script under
  torchrun it is the per-rank worker ``embark-calibrate`` launches.

Calibration measures the engine; planning does not: the planner reads only the
resulting constants.
"""

from lightning_embark.calibration._fit import (
    LinkFit,
    LookupFit,
    build_calibration,
    fit_alpha_beta,
    fit_lookup,
    hierarchical_efficiency,
    machine_memory_per_rank,
    parse_sizes,
    spearman,
    worker_script,
)
from lightning_embark.calibration._probes import DEFAULT_SIZES, measure_all

__all__ = [
    "DEFAULT_SIZES",
    "LinkFit",
    "LookupFit",
    "build_calibration",
    "fit_alpha_beta",
    "fit_lookup",
    "hierarchical_efficiency",
    "machine_memory_per_rank",
    "measure_all",
    "parse_sizes",
    "spearman",
    "worker_script",
]
