"""Optimizers of a recommendation model: a sparse one for embeddings, a dense one for MLPs.

Embedding tables and MLPs want different optimizers (MLPerf DLRM: row-wise Adagrad
for embeddings, Adagrad for the rest). When torchrec shards the tables, the sparse
optimizer runs *fused* inside the fbgemm TBE backward and is described by fbgemm
parameters; without sharding it is an ordinary torch optimizer over the embedding
weights. :class:`SparseOptimizerSpec` is the single description both come from, so
the sharded and the single-process runs use the same algorithm and hyper-parameters.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer
from torchrec.distributed.utils import optimizer_type_to_emb_opt_type
from torchrec.optim import RowWiseAdagrad

from lightning_embark.errors import ConfigError

#: Sparse optimizer names and the torch optimizer class each maps to. torchrec maps
#: these classes to fbgemm's EXACT_ROWWISE_ADAGRAD, EXACT_ADAGRAD and EXACT_SGD.
SPARSE_OPTIMIZERS: dict[str, type[Optimizer]] = {
    "rowwise_adagrad": RowWiseAdagrad,
    "adagrad": torch.optim.Adagrad,
    "sgd": torch.optim.SGD,
}

#: Dense optimizer names and their torch classes.
DENSE_OPTIMIZERS: dict[str, type[Optimizer]] = {
    "adagrad": torch.optim.Adagrad,
    "adam": torch.optim.Adam,
}


def _check_rate(owner: str, lr: float, eps: float) -> None:
    if not lr > 0:
        raise ConfigError(f"{owner}: lr must be > 0, got {lr!r}")
    if not eps >= 0:
        raise ConfigError(f"{owner}: eps must be >= 0, got {eps!r}")


@dataclass(frozen=True, kw_only=True)
class SparseOptimizerSpec:
    """The embedding optimizer, as a torch optimizer and as fbgemm fused parameters.

    Attributes:
        kind: ``"rowwise_adagrad"`` (MLPerf), ``"adagrad"`` or ``"sgd"``.
        lr: Learning rate.
        eps: Adagrad's denominator term (unused by SGD).
    """

    kind: str = "rowwise_adagrad"
    lr: float = 0.005
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in SPARSE_OPTIMIZERS:
            raise ConfigError(
                f"sparse optimizer {self.kind!r} is not supported; use one of "
                f"{sorted(SPARSE_OPTIMIZERS)}"
            )
        _check_rate(f"sparse optimizer {self.kind!r}", self.lr, self.eps)

    @property
    def optimizer_class(self) -> type[Optimizer]:
        """The torch optimizer class (also what ``apply_optimizer_in_backward`` receives)."""
        return SPARSE_OPTIMIZERS[self.kind]

    @property
    def optimizer_kwargs(self) -> dict[str, Any]:
        """Constructor keyword arguments of :attr:`optimizer_class`."""
        if self.kind == "sgd":
            return {"lr": self.lr}
        return {"lr": self.lr, "eps": self.eps}

    def fused_params(self) -> dict[str, Any]:
        """fbgemm TBE parameters that run the same optimizer fused in backward."""
        params: dict[str, Any] = {
            "optimizer": optimizer_type_to_emb_opt_type(self.optimizer_class),
            "learning_rate": self.lr,
        }
        if self.kind != "sgd":
            params["eps"] = self.eps
        return params

    def build(self, params: Iterable[nn.Parameter]) -> Optimizer:
        """A plain (non-fused) optimizer over ``params``."""
        return self.optimizer_class(list(params), **self.optimizer_kwargs)


@dataclass(frozen=True, kw_only=True)
class DenseOptimizerSpec:
    """The optimizer of every non-embedding parameter: ``"adagrad"`` or ``"adam"``."""

    kind: str = "adagrad"
    lr: float = 0.005
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.kind not in DENSE_OPTIMIZERS:
            raise ConfigError(
                f"dense optimizer {self.kind!r} is not supported; use one of "
                f"{sorted(DENSE_OPTIMIZERS)}"
            )
        _check_rate(f"dense optimizer {self.kind!r}", self.lr, self.eps)

    def build(self, params: Iterable[nn.Parameter]) -> Optimizer:
        """The optimizer over ``params``."""
        optimizer: Callable[..., Optimizer] = DENSE_OPTIMIZERS[self.kind]
        return optimizer(list(params), lr=self.lr, eps=self.eps)


class ChainedOptimizer(Optimizer):
    """Several optimizers stepped as one, with the closure evaluated once.

    Lightning's automatic optimization takes a single optimizer and passes it a
    closure that runs forward and backward; torchrec's ``CombinedOptimizer`` would
    call that closure once per child. This class evaluates it once, then steps every
    child. ``param_groups`` are the children's group dicts themselves, so learning-rate
    schedulers and gradient clipping act on the children directly.
    """

    def __init__(self, optimizers: Sequence[Optimizer]) -> None:
        if not optimizers:
            raise ConfigError("ChainedOptimizer needs at least one optimizer")
        self.optimizers: list[Optimizer] = list(optimizers)
        params = [p for opt in self.optimizers for g in opt.param_groups for p in g["params"]]
        super().__init__(params, {})
        self.param_groups = [g for opt in self.optimizers for g in opt.param_groups]
        self.state = ChainMap(*(opt.state for opt in self.optimizers))  # type: ignore[assignment]

    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """Evaluate ``closure`` (if any) once, then step every child optimizer."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for optimizer in self.optimizers:
            optimizer.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero (or drop) the gradients of every child."""
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict[str, Any]:
        """One entry per child, in order."""
        return {"optimizers": [opt.state_dict() for opt in self.optimizers]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        states = state_dict.get("optimizers")
        if not isinstance(states, list) or len(states) != len(self.optimizers):
            raise ConfigError(
                f"ChainedOptimizer state has {len(states) if isinstance(states, list) else 'no'} "
                f"optimizer states, expected {len(self.optimizers)}"
            )
        for optimizer, state in zip(self.optimizers, states, strict=False):
            optimizer.load_state_dict(state)
        self.param_groups = [g for opt in self.optimizers for g in opt.param_groups]
