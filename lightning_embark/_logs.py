"""Quieting known-harmless third-party log records, one filter per message, at the call.

Each filter names the library, the logger, the message and why it is harmless here,
and drops only that message from only that logger: around the call that produces it
where there is one call, else on the logger for the process that asks for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _DropPrefix(logging.Filter):
    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.prefix)


def drop(logger: logging.Logger, prefix: str) -> None:
    """Drop ``logger``'s own records whose message starts with ``prefix`` from now on
    (idempotent)."""
    if not any(isinstance(f, _DropPrefix) and f.prefix == prefix for f in logger.filters):
        logger.addFilter(_DropPrefix(prefix))


@contextmanager
def dropped(logger: logging.Logger, prefix: str) -> Iterator[None]:
    """Drop ``logger``'s own records whose message starts with ``prefix`` inside the block."""
    drop = _DropPrefix(prefix)
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


@contextmanager
def quiet_torchrec_planner() -> Iterator[None]:
    """torchrec's planner logs ``Sharding spec not found for <table>`` on the *root*
    logger once per data-parallel table: such tables have no sharding spec by design."""
    with dropped(logging.getLogger(), "Sharding spec not found for "):
        yield


def quiet_torchrec_fx_check() -> None:
    """torch warns once per process, from every rank, that ``is_fx_tracing`` also holds
    under ``torch.export``; torchrec's ``KeyedJaggedTensor`` code calls it on every
    forward to skip work while tracing, which no training step does."""
    drop(logging.getLogger("torch.fx._symbolic_trace"), "is_fx_tracing will return true")


#: Lightning's setup banners (rank-zero info, one ``Initializing distributed`` per rank):
#: the accelerators found, the litlogger tip, the process-group summary, the stop reason.
_LIGHTNING_BANNERS = {
    "lightning.pytorch.utilities.rank_zero": (
        "GPU available:",
        "TPU available:",
        "HPU available:",
        "\U0001f4a1 Tip:",
        "----",
        "`Trainer.fit` stopped:",
    ),
    "lightning.fabric.utilities.distributed": ("Initializing distributed:",),
}


def quiet_lightning_banners() -> None:
    """For programs that print their own summary (``embark-bench`` workers): Lightning's
    setup banners say nothing the summary does not, and its two advisories do not apply:
    the worker validates after ``fit`` (no ``val_dataloader`` during it) and loads data in
    the main process (an ``IterableDataset`` with ``__len__`` is exact there)."""
    import warnings

    for name, prefixes in _LIGHTNING_BANNERS.items():
        for prefix in prefixes:
            drop(logging.getLogger(name), prefix)
    warnings.filterwarnings(
        "ignore", message="You defined a `validation_step` but have no `val_dataloader`"
    )
    warnings.filterwarnings("ignore", message="Your `IterableDataset` has `__len__` defined")


#: (category, message regex, module regex, why it is harmless here), one per warning that
#: torchrec, fbgemm and Lightning raise on every rank while a sharding strategy sets up
#: and trains, on the pinned versions.
_KNOWN_WARNINGS: tuple[tuple[type[Warning], str, str, str], ...] = (
    (
        FutureWarning,
        "HeuristicalStorageReservation is known to cause issues",
        r"torchrec\.distributed\.planner\.planners",
        "torchrec's planner default; the baseline plans with torchrec's defaults on purpose",
    ),
    (
        FutureWarning,
        "`broadcast_buffers` is deprecated",
        r"torchrec\.distributed\..*",
        "torchrec's DDP wrapper passes DDP's old argument; the behaviour is unchanged",
    ),
    (
        UserWarning,
        "fbgemm::dense_embedding_codegen_lookup_function: an autograd kernel was not registered",
        r"torch\.autograd\.graph",
        "fbgemm's dense (data-parallel) lookup, differentiable through its own autograd function",
    ),
    (
        Warning,
        r"`isinstance\(treespec, LeafSpec\)` is deprecated",
        r"lightning\.pytorch\..*",
        "Lightning 2.6's pytree helper on torch 2.13",
    ),
    (
        FutureWarning,
        r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
        r"torch\.distributed\.c10d_logger",
        "torchrec's sharded modules call torch 2.13's old names of the two collectives",
    ),
)

#: (logger, message prefix, why) for torchrec's WARNING-level records of normal events.
_KNOWN_RECORDS: tuple[tuple[str, str, str], ...] = (
    (
        "torchrec.distributed.planner.storage_reservations",
        "There is a known issue with TorchRec's dense",
        "the model is materialised, so no dry run is involved",
    ),
    (
        "torchrec.distributed.utils",
        "Sharding Type is data_parallel, caching params will be ignored",
        "data-parallel tables have no cache to configure",
    ),
    (
        "torchrec.distributed.comm",
        "TORCHREC_RESOLVED_POD_SIZE not set",
        "the local world size is what the strategy sets for torchrec",
    ),
    ("torchrec.distributed.comm", "[Connection] ", "torchrec logs each process group it creates"),
)


def quiet_known_third_party() -> None:
    """Drop, on this process, the known-harmless third-party warnings and log records a
    sharding strategy triggers on every rank (each listed with its reason above)."""
    import warnings

    for category, message, module, _why in _KNOWN_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, prefix, _why in _KNOWN_RECORDS:
        drop(logging.getLogger(name), prefix)
    quiet_torchrec_fx_check()
