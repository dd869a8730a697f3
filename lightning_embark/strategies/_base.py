"""What the embark and torchrec strategies share: both shard the embeddings themselves.

Both keep the module's tables on ``meta`` until they shard them (``shards_embeddings``),
restore checkpoints only after sharding, refuse trainer options an in-backward
embedding optimizer cannot honour, print their plan, leave the sharded module where it is
at teardown, and report a collective that fails because a peer is gone as a
:class:`~lightning_embark.errors.PeerError`, in a step or between steps.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, ClassVar

from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from lightning_embark._logs import quiet_known_third_party
from lightning_embark.errors import ConfigError
from lightning_embark.exchange import dense_peer_failures, named_peer_failures
from lightning_embark.topology import Topology


class ShardingStrategy(DDPStrategy):
    """A DDP strategy for the dense part whose embedding tables it shards itself.

    Subclasses shard in :meth:`setup` and say which trainer precisions they train
    correctly under.
    """

    #: The name the strategy is registered under (see :mod:`lightning_embark.registry`).
    strategy_name: ClassVar[str]
    #: Tells shardable modules to keep their tables on ``meta`` (see ``ShardableModule``).
    shards_embeddings = True
    #: Trainer precisions under which the strategy trains correctly.
    supported_precisions: ClassVar[tuple[str, ...]] = ("32-true", "32")
    #: How to get reduced precision instead, for the refusal's message.
    precision_hint: ClassVar[str] = ""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        quiet_known_third_party()
        self.topology: Topology | None = None

    @property
    @abstractmethod
    def plan(self) -> Any:
        """The plan executed (None before setup unless one was given)."""

    @abstractmethod
    def format_plan(self, plan: Any) -> str:
        """``plan`` as text, one line per table."""

    def plan_summary(self) -> str:
        """The executed plan as text (after setup)."""
        if self.plan is None:
            return "no plan yet: the strategy plans during Trainer setup"
        return self.format_plan(self.plan)

    def announce_plan(self) -> None:
        """Print the plan once, from rank 0, through Lightning's rank-zero info channel
        (shown by default, like Lightning's own setup lines), shortened by
        :func:`concise_summary` for plans of many tables."""
        rank_zero_info(f"{self.strategy_name} plan:\n{concise_summary(self.plan_summary())}")

    @classmethod
    def check_trainer_options(
        cls, *, precision: str, gradient_clip_val: float | None, accumulate_grad_batches: int
    ) -> None:
        """Refuse trainer options an in-backward (fused) embedding optimizer cannot honour.

        Raises:
            ConfigError: gradient clipping (embedding gradients are applied inside
                backward and never materialised, so no norm can include them), gradient
                accumulation (the tables are updated by every backward, not every k-th),
                or a precision outside :attr:`supported_precisions`.
        """
        name = cls.strategy_name
        if gradient_clip_val:
            raise ConfigError(
                f"gradient_clip_val={gradient_clip_val} is not supported with strategy={name!r}: "
                "the sparse optimizer updates the embedding tables inside backward, so their "
                "gradients never exist for a global norm; remove gradient_clip_val from the "
                "Trainer"
            )
        if accumulate_grad_batches != 1:
            raise ConfigError(
                f"accumulate_grad_batches={accumulate_grad_batches} is not supported with "
                f"strategy={name!r}: the sparse optimizer updates the embedding tables in every "
                "backward; use 1 and a larger batch"
            )
        if str(precision) not in cls.supported_precisions:
            raise ConfigError(
                f"precision={precision!r} is not supported with strategy={name!r}; use one of "
                f"{list(cls.supported_precisions)} ({cls.precision_hint})"
            )

    def check_fitting_trainer(self, trainer: Trainer) -> None:
        """:meth:`check_trainer_options` with ``trainer``'s options, when it is fitting
        (validation, test and predict runs never update the tables)."""
        if trainer.state.fn == TrainerFn.FITTING:
            self.check_trainer_options(
                precision=trainer.precision,
                gradient_clip_val=trainer.gradient_clip_val,
                accumulate_grad_batches=trainer.accumulate_grad_batches,
            )

    # --- a peer's failure outside the embedding exchange ---------------------------

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's step, with DDP's buffer broadcast and Lightning's collectives failing
        on a dead peer as a :class:`~lightning_embark.errors.PeerError` (the engine's own
        exchanges already do)."""
        with dense_peer_failures(self.global_rank, "training forward"):
            return super().training_step(*args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with dense_peer_failures(self.global_rank, "validation forward"):
            return super().validation_step(*args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with dense_peer_failures(self.global_rank, "test forward"):
            return super().test_step(*args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with dense_peer_failures(self.global_rank, "predict forward"):
            return super().predict_step(*args, **kwargs)

    @override
    def backward(self, closure_loss: Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> Tensor:
        """Backward, with the dense-gradient all-reduce failing on a dead peer as a
        :class:`~lightning_embark.errors.PeerError`."""
        with dense_peer_failures(self.global_rank, "backward"):
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    def settle(self) -> None:
        """Finish the sharded modules' work still in flight from the last step (raising
        what it met); called before each of Lightning's collectives between steps. The
        base strategy leaves none in flight."""

    # Lightning's collectives between steps (callbacks, checkpoints, logging) fail the same
    # way: a rank killed while its peers save a checkpoint is named there too. Each settles
    # first: a rank must not wait in one of them while its own work in flight (on a lane
    # of the engine's groups) has failed, or still waits for a peer that is in turn
    # waiting for it here (seen: a rank's host peer blocked in the host group, it in
    # Lightning's barrier, until the groups' timeout).

    @contextmanager
    def _between_steps(self, what: str) -> Iterator[None]:
        """Settle, then run Lightning's collective ``what``, a peer's failure named."""
        with named_peer_failures(self.global_rank, f"Lightning's {what}"):
            self.settle()
            yield

    @override
    def barrier(self, *args: Any, **kwargs: Any) -> None:
        with self._between_steps("barrier"):
            super().barrier(*args, **kwargs)

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        with self._between_steps("broadcast"):
            return super().broadcast(obj, src)

    @override
    def reduce(self, *args: Any, **kwargs: Any) -> Any:
        with self._between_steps("reduce"):
            return super().reduce(*args, **kwargs)

    @override
    def all_gather(self, *args: Any, **kwargs: Any) -> Any:
        with self._between_steps("all-gather"):
            return super().all_gather(*args, **kwargs)

    @property
    @override
    def restore_checkpoint_after_setup(self) -> bool:
        """Restore after sharding: the unsharded tables are never allocated."""
        return True

    @override
    def teardown(self) -> None:
        """Unwrap DDP and release the plugins, leaving the module where it is.

        Lightning's own teardown also moves the module to the CPU. A sharded module
        stays where its shards live (fbgemm tables cannot move), and a module whose
        setup was refused still has its tables on ``meta``, which cannot move either,
        so the move would hide the refusal. The rest is Lightning's teardown.
        """
        if isinstance(self.model, DistributedDataParallel):
            self.model = self.lightning_module
        assert self.cluster_environment is not None and self.accelerator is not None
        self.cluster_environment.teardown()
        self.precision_plugin.teardown()
        self.accelerator.teardown()
        self.checkpoint_io.teardown()


def concise_summary(summary: str, *, max_lines: int = 40, per_group: int = 3) -> str:
    """``summary`` whole when it has at most ``max_lines`` lines; else its unindented
    lines (topology, plan, clusters, towers) with the first ``per_group`` indented (table)
    lines under each and a count of the rest, so a plan of 500 tables prints in a screen.
    """
    lines = summary.splitlines()
    if len(lines) <= max_lines:
        return summary
    out: list[str] = []
    hidden = total = 0
    for line in [*lines, ""]:  # a closing sentinel flushes the last group
        if line.startswith(" "):
            total += 1
            if total <= per_group:
                out.append(line)
            else:
                hidden += 1
            continue
        if hidden:
            out.append(f"  ... {hidden} more")
        hidden = total = 0
        if line:
            out.append(line)
    out.append(f"({len(lines)} lines in all: trainer.strategy.plan_summary())")
    return "\n".join(out)
