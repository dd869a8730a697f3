"""``ShardedEmbeddingBagCollection``: torchrec's EBC, executed by the engine.

A drop-in replacement for :class:`torchrec.EmbeddingBagCollection`: it takes the
rank's *local* ``KeyedJaggedTensor`` and returns the ``KeyedTensor`` the unsharded
collection would return for those samples (same keys, order and widths), so
torchrec's ``DLRM`` / ``DLRM_DCN`` and user models run unchanged. Everything else is
the :class:`~lightning_embark.engine.EmbeddingEngine` it is: tables as blocks on the
ranks the plan names, one fused exchange per cluster and phase, the sparse optimizer
applied at the owners inside backward (the rows are not ``nn.Parameter``s, so a dense
optimizer or DDP never sees them).

Input checks happen before any data is sent: a variable batch size per feature, a
missing feature or missing weights, and an out-of-range ID raise a
:class:`~lightning_embark.errors.ConfigError` on the rank that has it, and every other
rank raises too (the first exchanging cluster's header carries a status word), so
nothing hangs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor, KeyedTensor

from lightning_embark.engine import (
    EmbeddingEngine,
    EngineConfig,
    JaggedBatch,
    SparseOptimizer,
    checked_jagged,
    table_config,
)
from lightning_embark.errors import ConfigError
from lightning_embark.plan import Plan


class ShardedEmbeddingBagCollection(EmbeddingEngine):
    """An ``EmbeddingBagCollection`` whose tables are sharded by a :class:`Plan`.

    Args:
        tables: torchrec table configs (as given to ``EmbeddingBagCollection``).
        plan: The sharding plan; its ``world_size`` must be the group's size.
        sparse_optimizer: Optimizer applied to embedding rows during backward.
        **kwargs: The rest of :class:`~lightning_embark.engine.EmbeddingEngine`'s
            arguments (``is_weighted``, ``process_group``, ``config``, ``weights``,
            ``tower_modules``, ``device``).
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        plan: Plan,
        *,
        sparse_optimizer: SparseOptimizer,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            [table_config(c) for c in tables], plan, sparse_optimizer=sparse_optimizer, **kwargs
        )
        self._torchrec_configs = list(tables)

    @classmethod
    def from_ebc(
        cls,
        ebc: EmbeddingBagCollection,
        plan: Plan,
        *,
        sparse_optimizer: SparseOptimizer,
        process_group: Any = None,
        config: EngineConfig | None = None,
        device: torch.device | str | None = None,
    ) -> ShardedEmbeddingBagCollection:
        """Shard an existing (CPU or meta) collection; CPU weights are copied block by block
        onto ``device`` (the engine's; None: the CPU), run as ``config`` says (None: the
        defaults of :class:`~lightning_embark.engine.EngineConfig`)."""
        weights = {
            table.name: ebc.embedding_bags[table.name].weight.detach()
            for table in ebc.embedding_bag_configs()
            if not ebc.embedding_bags[table.name].weight.is_meta
        }
        return cls(
            ebc.embedding_bag_configs(),
            plan,
            sparse_optimizer=sparse_optimizer,
            is_weighted=ebc.is_weighted(),
            process_group=process_group,
            config=config,
            weights=weights,
            device=device,
        )

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        """The torchrec table configs it was built from (torchrec's EBC API)."""
        return list(self._torchrec_configs)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """The pooled ``KeyedTensor`` of this rank's samples (see the module docstring)."""
        values = self._lookup_batch(*self._checked_kjt(features), key=features.values())
        return KeyedTensor(keys=self.output_keys, length_per_key=self.output_dims, values=values)

    def prefetch(
        self, features: KeyedJaggedTensor, *, rejected: ConfigError | None = None
    ) -> None:
        """Start the input distribution of a ``KeyedJaggedTensor`` that a later
        :meth:`forward` will get (the same object, or one sharing its ``values()`` tensor,
        as ``.to()`` on its own device gives); see
        :meth:`~lightning_embark.engine.EmbeddingEngine.prefetch`.

        ``rejected``: what is wrong with the rest of the batch (e.g. NaN dense features),
        found by the caller; the forward that takes the batch raises it, and every other
        rank's raises that this rank rejected its batch, as for an out-of-range ID here.
        """
        batch, error = self._checked_kjt(features)
        self._prefetch_batch(batch, error or rejected, key=features.values())

    def _checked_kjt(self, features: KeyedJaggedTensor) -> tuple[JaggedBatch, ConfigError | None]:
        """The KJT's features in the engine's order (the KJT's own tensors when they are in
        that order), and the first problem found."""
        error = None
        keys = features.keys()
        size = features.stride()
        if features.variable_stride_per_key():
            error = ConfigError(
                "variable batch size per feature (VBE) is not supported; give one stride"
            )
            batch = JaggedBatch.empty(len(keys), size, self.device)
        else:
            batch = JaggedBatch(
                values=features.values(),
                lengths=features.lengths().reshape(len(keys), size).to(torch.int64),
                counts=tuple(features.length_per_key()),
                weights=features.weights_or_none(),
            )
        return checked_jagged(
            batch, keys, self._features, error, weighted=self._is_weighted, device=self.device
        )
