"""lightning-embark: EMBark embedding clusters and DMT towers for PyTorch Lightning.

Importing the package registers its Lightning strategies (``strategy="embark"``,
``strategy="torchrec"``, ``strategy="torchrec-fp16"``) with Lightning's
``StrategyRegistry``: Lightning has no entry-point discovery for strategies, so
``import lightning_embark`` must come before ``Trainer(strategy=...)``.
"""

from lightning_embark.registry import register_strategies
from lightning_embark.errors import ClusterError, ConfigError, DataFormatError, EmbarkError, PeerError
from lightning_embark.spec import ModelSpec, TableSpec, load_spec
from lightning_embark.topology import Topology, topology_preset

__all__ = [
    "ClusterError",
    "ConfigError",
    "DataFormatError",
    "EmbarkError",
    "ModelSpec",
    "PeerError",
    "TableSpec",
    "Topology",
    "load_spec",
    "topology_preset",
]
__version__ = "0.1.0"

register_strategies()
