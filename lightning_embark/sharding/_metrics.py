"""Per-step engine metrics logged through Lightning: where the time goes, what the IDs look like.

The engine does not time its own phases, so this callback times it from the
outside: the sharded modules' forward (input distribution, lookup, output
exchange) with module hooks, and their backward (gradient exchange and the fused
sparse update) with hooks on the autograd node the engine's forward creates. With the
engine's lane (``overlap=True``) the backward only encodes and hands its exchanges and
updates to the lane, which runs them on past the step: what the next forward waits for
them counts in its ``embedding_forward_ms``, the rest overlaps the dense part.
Everything else in the step is the dense part (dense forward/backward, DDP
all-reduce, dense optimizer, data). Add
:class:`~lightning_embark.accounting.CommAccountingCallback`
for bytes per link class and the share of the step blocked in all-to-alls, which
splits the engine time into exchange and lookup.

Logged per step (``on_step``, from rank 0 like other step metrics):
``embark/step_ms``, ``embark/embedding_forward_ms``, ``embark/embedding_backward_ms``,
``embark/dense_ms`` and ``embark/unique_ratio/<table>`` (distinct IDs / IDs of this
rank's batch: the statistic that decides UB against RB).
"""

from __future__ import annotations

import time
from typing import Any

import lightning.pytorch as pl
import torch
from torch import nn
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from lightning_embark.errors import ConfigError
from lightning_embark.sharding._discovery import sample_stats


class EmbarkMetricsCallback(pl.Callback):
    """Times the engine's forward and backward per step and logs the unique ratios it sees.

    Args:
        unique_ratios: Also compute per-table unique ratios (one ``torch.unique`` per
            table and step on this rank's IDs).
        log: Whether to log through ``LightningModule.log_dict``; records stay in
            :attr:`steps` either way.
    """

    def __init__(self, *, unique_ratios: bool = True, log: bool = True) -> None:
        self._unique = unique_ratios
        self._log = log
        self.steps: list[dict[str, float]] = []
        self._handles: list[Any] = []
        self._current: dict[str, float] = {}
        self._marks: dict[str, float] = {}

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        sharded = getattr(trainer.strategy, "sharded_modules", None)
        if not sharded:
            raise ConfigError(
                "EmbarkMetricsCallback measures the embark engine; use it with strategy='embark' "
                f"(this Trainer runs {type(trainer.strategy).__name__})"
            )
        for module in sharded.values():
            self._handles.append(module.register_forward_pre_hook(self._before_forward))
            self._handles.append(module.register_forward_hook(self._after_forward))

    def _before_forward(self, module: nn.Module, inputs: tuple[Any, ...]) -> None:
        self._marks["forward"] = time.perf_counter()
        features = inputs[0] if inputs else None
        if self._unique and torch.is_grad_enabled() and isinstance(features, KeyedJaggedTensor):
            configs = module.embedding_bag_configs()  # type: ignore[operator]  # a sharded collection
            for name, stats in sample_stats(configs, features).items():
                if stats.unique_ratio is not None:
                    self._current[f"embark/unique_ratio/{name}"] = stats.unique_ratio

    def _after_forward(self, module: nn.Module, inputs: Any, output: Any) -> None:
        self._add("embark/embedding_forward_ms", time.perf_counter() - self._marks.pop("forward"))
        # A KeyedTensor (embedding bag collections) or a tensor (tower collections).
        values = output if isinstance(output, torch.Tensor) else output.values()
        node = _engine_node(values.grad_fn)
        if node is not None:
            node.register_prehook(self._before_backward)
            node.register_hook(self._after_backward)

    def _before_backward(self, grad_outputs: Any) -> None:
        self._marks["backward"] = time.perf_counter()

    def _after_backward(self, grad_inputs: Any, grad_outputs: Any) -> None:
        self._add(
            "embark/embedding_backward_ms", time.perf_counter() - self._marks.pop("backward")
        )

    def _add(self, key: str, seconds: float) -> None:
        self._current[key] = self._current.get(key, 0.0) + 1000 * seconds

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self._current = {}
        self._marks["step"] = time.perf_counter()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        record = dict(self._current)
        record["embark/step_ms"] = 1000 * (time.perf_counter() - self._marks.pop("step"))
        record["embark/dense_ms"] = max(
            0.0,
            record["embark/step_ms"]
            - record.get("embark/embedding_forward_ms", 0.0)
            - record.get("embark/embedding_backward_ms", 0.0),
        )
        self.steps.append(record)
        if self._log:
            pl_module.log_dict(
                record, on_step=True, on_epoch=False, sync_dist=False, rank_zero_only=True
            )

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._remove()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._remove()


def _engine_node(node: Any, depth: int = 8) -> Any:
    """The engine's own backward node at or under ``node`` (a tower collection's output
    is a concatenation of views of it), so the backward timing brackets the engine's
    backward and not the concatenation's; ``node`` itself if none is found nearby."""
    frontier, seen = [node], set()
    for _ in range(depth):
        following = []
        for current in frontier:
            if current is None or id(current) in seen:
                continue
            seen.add(id(current))
            if current.name().startswith("_LookupBackward"):
                return current
            following += [n for n, _ in current.next_functions]
        frontier = following
    return node
