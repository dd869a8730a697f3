"""with_embark_callbacks: the metrics callbacks once each, before checkpoints; the summary
swapped; nothing added with metrics=False."""

from __future__ import annotations

from lightning.pytorch.callbacks import ModelCheckpoint, ModelSummary, ProgressBar

from lightning_embark.accounting import CommAccountingCallback
from lightning_embark.sharding import (
    EmbarkMetricsCallback,
    EmbarkModelSummary,
    with_embark_callbacks,
)


def test_metrics_callbacks_are_added_once_before_checkpoints() -> None:
    checkpoint = ModelCheckpoint()
    out = with_embark_callbacks([ModelSummary(), checkpoint], metrics=True, ranks_per_host=2)
    assert [type(c) for c in out] == [
        EmbarkModelSummary,
        CommAccountingCallback,
        EmbarkMetricsCallback,
        ModelCheckpoint,
    ]
    assert out[-1] is checkpoint and out[1]._ranks_per_host == 2
    assert [type(c) for c in with_embark_callbacks(out, metrics=True, ranks_per_host=2)] == [
        type(c) for c in out
    ]  # twice (a second setup) adds nothing


def test_the_users_own_metrics_callbacks_are_kept() -> None:
    mine = CommAccountingCallback(log=False)
    out = with_embark_callbacks([mine], metrics=True, ranks_per_host=1)
    assert out[0] is mine and [type(c) for c in out] == [
        CommAccountingCallback,
        EmbarkMetricsCallback,
    ]


def test_metrics_false_adds_nothing() -> None:
    bar = ProgressBar()
    assert with_embark_callbacks([bar], metrics=False, ranks_per_host=1) == [bar]
