"""The model summary counts tables held outside ``nn.Parameter`` s (the engine's blocks)."""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.callbacks import ModelSummary
from torch import nn
from torchrec.modules.embedding_configs import EmbeddingBagConfig
from torchrec.modules.embedding_modules import EmbeddingBagCollection

from lightning_embark.sharding import (
    EmbarkModelSummary,
    TableCountingSummary,
    table_parameters,
)
from lightning_embark.sharding._model_summary import counting_tables


class _Holder(LightningModule):
    """A dense layer and an (empty) stand-in for a sharded collection at ``sparse.ebc``."""

    def __init__(self) -> None:
        super().__init__()
        self.dense = nn.Linear(4, 2)  # 10 parameters
        self.sparse = nn.Module()
        self.sparse.ebc = nn.Module()


def test_tables_count_in_their_layers_and_the_totals() -> None:
    module = _Holder()
    summary = TableCountingSummary(module, tables={"sparse.ebc": 36_000})
    assert dict(zip(summary.layer_names, summary.param_nums, strict=True)) == {
        "dense": 10,
        "sparse": 36_000,
    }
    assert summary.total_parameters == summary.trainable_parameters == 36_010
    assert summary.model_size == 36_010 * 4e-6  # fp32 bytes, in MB
    assert "36.0 K" in str(summary)
    deep = TableCountingSummary(module, tables={"sparse.ebc": 36_000}, max_depth=2)
    assert dict(zip(deep.layer_names, deep.param_nums, strict=True))["sparse.ebc"] == 36_000
    # A layer whose name only shares a prefix with the path holds none of the tables.
    assert TableCountingSummary(module, tables={"dense_other": 5}).param_nums == [10, 0]


def test_table_parameters_are_rows_times_width_per_collection() -> None:
    configs = [
        EmbeddingBagConfig(
            name=f"t{i}", num_embeddings=rows, embedding_dim=8, feature_names=[f"f{i}"]
        )
        for i, rows in enumerate((100, 250))
    ]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    assert table_parameters({"a.b": ebc}) == {"a.b": (100 + 250) * 8}


def test_lightnings_summary_callback_is_swapped_with_its_settings() -> None:
    given = ModelSummary(max_depth=3)
    swapped = counting_tables(given)
    assert isinstance(swapped, EmbarkModelSummary) and swapped._max_depth == 3

    class Mine(ModelSummary):
        pass

    mine = Mine()
    assert counting_tables(mine) is mine  # a user's own summary is left alone
    assert counting_tables(swapped) is swapped
