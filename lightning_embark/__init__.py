"""lightning-embark: EMBark embedding clusters and DMT towers for PyTorch Lightning.

Importing the package registers its Lightning strategies (``strategy="embark"``,
``strategy="torchrec"``, ``strategy="torchrec-fp16"``) with Lightning's
``StrategyRegistry``: Lightning has no entry-point discovery for strategies, so
``import lightning_embark`` must come before ``Trainer(strategy=...)``.

The strategy classes are exported too, but imported on first use: they pull in
torchrec and fbgemm, which the plan, spec, wire and kernel modules do without (a
GPU image without torchrec can run the kernels' check).
"""

from typing import Any

from lightning_embark.errors import (
    CheckpointError,
    ConfigError,
    DataFormatError,
    EmbarkError,
    EmulationError,
    PeerError,
    PlanInfeasibleError,
)
from lightning_embark.plan import Plan
from lightning_embark.registry import register_strategies
from lightning_embark.spec import ModelSpec, TableSpec, load_spec
from lightning_embark.topology import Topology, topology_preset

__all__ = [
    "CheckpointError",
    "ConfigError",
    "DataFormatError",
    "EmbarkError",
    "EmbarkStrategy",
    "EmulationError",
    "ModelSpec",
    "PeerError",
    "Plan",
    "PlanInfeasibleError",
    "TableSpec",
    "Topology",
    "TorchrecStrategy",
    "load_spec",
    "topology_preset",
]
__version__ = "0.1.0"

_STRATEGY_CLASSES = ("EmbarkStrategy", "TorchrecStrategy")


def __getattr__(name: str) -> Any:
    if name in _STRATEGY_CLASSES:
        from lightning_embark import strategies

        return getattr(strategies, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


register_strategies()
