"""The bench's rank program: its Trainer draws no bar of its own."""

from __future__ import annotations

import pytest

from lightning_embark.harness._training import bench_trainer


def test_the_bench_trainer_draws_no_lightning_progress_bar(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every rank's Lightning bar would interleave with rank 0's step bar; the bench's
    Trainer has none, nor a logger or checkpoints."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    trainer = bench_trainer("auto", num_hosts=1, ranks_per_host=1, max_steps=1, callbacks=[])
    assert trainer.progress_bar_callback is None
    assert trainer.logger is None and trainer.checkpoint_callback is None
    assert trainer.max_steps == 1
