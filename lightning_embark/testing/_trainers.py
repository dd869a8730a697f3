"""A quiet CPU ``Trainer`` for tests and benchmarks: only what the run measures prints."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

#: What every test and benchmark run turns off: logger, checkpoints, progress bar, model
#: summary and the sanity validation steps (which would run the sharded model before
#: the first training step and shift every step count).
QUIET_TRAINER_DEFAULTS: dict[str, Any] = {
    "accelerator": "cpu",
    "devices": 1,
    "logger": False,
    "enable_checkpointing": False,
    "enable_progress_bar": False,
    "enable_model_summary": False,
    "num_sanity_val_steps": 0,
}


def quiet_trainer(**overrides: Any) -> Trainer:
    """``Trainer(**(QUIET_TRAINER_DEFAULTS | overrides))``: the overrides win."""
    from lightning.pytorch import Trainer

    return Trainer(**(QUIET_TRAINER_DEFAULTS | overrides))
