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
* The strategy's shell (:mod:`lightning_embark.strategies._torchrec`): manual optimisation,
  the pipeline's ``progress`` in ``training_step``, the model detached from the pipeline
  while Lightning validates.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from lightning_embark.errors import ConfigError


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


def make_train_pipeline(model: nn.Module, optimizer: Any, device: torch.device) -> Any:
    """torchrec's ``TrainPipelineSparseDist`` over the DMP ``model`` and ``optimizer``
    (Lightning's, so that its steps count), executing every batch it is given."""
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    return TrainPipelineSparseDist(model, optimizer, device, execute_all_batches=True)
