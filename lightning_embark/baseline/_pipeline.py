"""torchrec's own training pipeline (``TrainPipelineSparseDist``) under Lightning.

torchrec overlaps the input distribution of batch ``i + 1`` (the KJT splits and ID
all-to-alls of its sharded collections) with batch ``i``'s forward and backward: its
pipeline takes the batches from an iterator, rewrites the sharded modules' forwards
(found by tracing the model with ``torch.fx``) and runs forward, backward and the
optimizer step itself. Three pieces let ``strategy="torchrec"`` hand it the step:

* :class:`BatchLoss`, the module DMP wraps: while pipelined, ``forward(batch)`` returns
  ``(loss, (loss, output))`` from the LightningModule's ``batch_loss(batch)``, the
  signature torchrec's pipeline calls and traces (the sharded collections' input must be
  an attribute of the batch); otherwise it forwards to the LightningModule (Lightning's
  validation and prediction steps go through it).
* :class:`LookaheadLoader`: the training dataloader read by two cursors: Lightning's
  (one batch ahead) and the pipeline's (two ahead), which see the same batches in the same
  order, so step ``i`` of Lightning is step ``i`` of the pipeline.
* :func:`set_pipelined`: the switch between the pipeline's calls and Lightning's, which the
  strategy's shell (:mod:`lightning_embark.strategies._torchrec`) flips around the
  pipeline's ``progress`` in ``training_step`` and while Lightning validates (the model is
  detached from the pipeline then), under manual optimisation.

DMP shards :class:`BatchLoss`, not the LightningModule, so a plan of the module's own paths
is moved under the wrapper (:func:`plan_under_batch_loss`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.types import ShardingPlan

from lightning_embark.errors import ConfigError

#: Where the LightningModule sits under the wrapper DMP shards when pipelined
#: (:attr:`BatchLoss.lightning_module`).
_PREFIX = "lightning_module."


class BatchLoss(nn.Module):
    """The LightningModule as torchrec's pipeline calls it: ``forward(batch) -> (loss, out)``.

    Args:
        module: The LightningModule; it must have ``batch_loss(batch) -> (loss, output)``
            (:class:`~lightning_embark.models.DLRMModule` has).

    Raises:
        ConfigError: the module has no ``batch_loss``.
    """

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        batch_loss = getattr(module, "batch_loss", None)
        if not callable(batch_loss):
            raise ConfigError(
                f"TorchrecStrategy(pipeline=True) runs torchrec's train pipeline, which calls "
                f"the model on a whole batch; {type(module).__name__} has no batch_loss(batch) "
                "-> (loss, output) method (DLRMModule has): add one, or pipeline=False"
            )
        self.lightning_module = module
        self._batch_loss: Callable[[Any], tuple[torch.Tensor, torch.Tensor]] = batch_loss
        #: Whether a call is torchrec's pipeline's (True) or Lightning's (False).
        self.pipelined = False

    def forward(self, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        if self.pipelined:
            loss, output = self._batch_loss(inputs)
            return loss, (loss.detach(), output.detach())
        return self.lightning_module(inputs, *args, **kwargs)


class LookaheadLoader:
    """A dataloader iterated by Lightning whose every pass also gives a second iterator
    over the same batches (``itertools.tee``) to ``on_iter``, for torchrec's pipeline.

    Everything but iteration is the wrapped loader's (length, sampler, dataset).

    Args:
        loader: The training dataloader.
        on_iter: Called with the second iterator at the start of each pass.
    """

    def __init__(self, loader: Any, on_iter: Callable[[Iterator[Any]], None]) -> None:
        self.loader = loader
        self._on_iter = on_iter

    def __iter__(self) -> Iterator[Any]:
        mine, theirs = itertools.tee(iter(self.loader))
        self._on_iter(theirs)
        return mine

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


def lightning_module_under(module: nn.Module) -> nn.Module:
    """The LightningModule under DMP's module (the pipeline's wrapper, if any)."""
    return module.lightning_module if isinstance(module, BatchLoss) else module


def plan_under_batch_loss(plan: ShardingPlan) -> ShardingPlan:
    """``plan`` with the module's own paths moved under :class:`BatchLoss`, the wrapper DMP
    shards instead; a plan already made for the wrapper is returned as it is."""
    if any(path.startswith(_PREFIX) for path in plan.plan):
        return plan
    return ShardingPlan({_PREFIX + path: value for path, value in plan.plan.items()})


def set_pipelined(dmp: DistributedModelParallel, on: bool) -> None:
    """Route the wrapper's calls to torchrec's pipeline (``on``) or to Lightning. The
    wrappers above the LightningModule (DMP, its DDP, :class:`BatchLoss`) take the
    module's train/eval flag too: Lightning switches only the module back to training
    after a validation, and torchrec's pipeline skips backward and the optimizer step
    while DMP says eval."""
    wrapper = dmp.module
    assert isinstance(wrapper, BatchLoss)
    wrapper.pipelined = on
    training = wrapper.lightning_module.training
    for module in (dmp, dmp._dmp_wrapped_module, wrapper):
        module.training = training


def make_train_pipeline(model: nn.Module, optimizers: Sequence[Any], device: torch.device) -> Any:
    """torchrec's ``TrainPipelineSparseDist`` over the DMP ``model`` and the one optimizer
    of ``optimizers`` (Lightning's, so that its steps count), executing every batch it is
    given.

    Raises:
        ConfigError: ``optimizers`` is not one optimizer (torchrec's pipeline takes one).
    """
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    if len(optimizers) != 1:
        raise ConfigError(
            "TorchrecStrategy(pipeline=True) hands torchrec's pipeline one optimizer, but "
            f"configure_optimizers gave {len(optimizers)}; combine them "
            "or use pipeline=False"
        )
    return TrainPipelineSparseDist(model, optimizers[0], device, execute_all_batches=True)
