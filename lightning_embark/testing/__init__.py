"""What tests and benchmarks share: gloo ranks on one CPU machine, the unsharded oracle,
and small scenarios that put every layout into one plan."""

from lightning_embark.testing._oracle import ReferenceOptimizer
from lightning_embark.testing._ranks import free_port, load_module, run_gloo_ranks
from lightning_embark.testing._scenarios import (
    Scenario,
    all_layouts_plan,
    concat_batches,
    random_batches,
)

__all__ = [
    "ReferenceOptimizer",
    "Scenario",
    "all_layouts_plan",
    "concat_batches",
    "free_port",
    "load_module",
    "random_batches",
    "run_gloo_ranks",
]
