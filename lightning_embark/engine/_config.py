"""How an engine runs its plan, whatever the plan: the one place its options default.

:class:`EngineConfig` travels whole from the user to the clusters: ``EmbarkStrategy``
builds one from its keyword arguments (whose defaults are read from here), its options
hold it, sharding hands it to each sharded collection and the collection to its
:class:`~lightning_embark.engine.EmbeddingEngine`. ``embark-bench`` and the GPU check
take their defaults from it too, so a plain engine, the strategy and the bench run the
same way unless told otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

from lightning_embark.engine._placement import STORES
from lightning_embark.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The engine's execution options (every option is bit-identical in its results: they
    change where and when work runs, never what it computes).

    Attributes:
        store: The owners' store: ``"auto"`` (fbgemm's table-batched kernels where they
            run, else torch), ``"fbgemm"`` or ``"torch"``.
        seed: Seed of the init of tables that come without weights (torchrec's uniform
            ``(-1/sqrt(rows), 1/sqrt(rows))``, seeded per (table, row shard)).
        pipeline: Run each batch's input distribution (the RB and UB clusters' headers
            and IDs) a step ahead, when ``prefetch`` gave the batch before its lookup
            (:mod:`lightning_embark.engine._pipeline`), over a process group of its own.
        overlap: Run each cluster's exchanges on the engine's lane, a worker thread issuing
            them in plan order (:mod:`lightning_embark.engine._lane`), so that one
            cluster's exchange overlaps the next cluster's lookups and encoding, and the
            backward's exchanges and updates run on past the step until something reads
            the blocks; the engine's collectives then go over a group of its own.
    """

    store: str = "auto"
    seed: int = 0
    pipeline: bool = True
    overlap: bool = True

    def __post_init__(self) -> None:
        if self.store not in STORES:
            raise ConfigError(f"engine store={self.store!r} is unknown; use one of {list(STORES)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"engine seed must be an int, got {self.seed!r}")
        for name in ("pipeline", "overlap"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(
                    f"engine {name} must be True or False, got {getattr(self, name)!r}"
                )
