"""What the engine checks before a batch's data moves, and where its groups and device come from.

Pure functions of the batch and the engine's features and tables (:class:`FeatureInfo`,
:class:`TableInfo`): a problem is returned as the :class:`ConfigError` that names it rather
than raised, because the engine must still take part in its first exchange (whose header
carries the status) so that every rank raises and none waits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark.engine._batch import FeatureBatch
from lightning_embark.engine._jagged import JaggedBatch
from lightning_embark.engine._routing import FeatureInfo, TableInfo
from lightning_embark.errors import ConfigError


def checked_batch(
    features: Mapping[str, FeatureBatch],
    infos: Sequence[FeatureInfo],
    size: int,
    error: ConfigError | None,
    *,
    weighted: bool,
    device: torch.device,
) -> tuple[JaggedBatch, ConfigError | None]:
    """The batch in ``infos`` order (weights dropped when not ``weighted``) and the first
    problem of ``error`` (the caller's), a missing feature or missing weights; with a
    problem, every feature is an empty batch of ``size`` samples on ``device``, which is all
    the exchanges need to carry the status."""
    missing = [f.name for f in infos if f.name not in features]
    if error is None and missing:
        error = ConfigError(
            f"features {missing} are missing from the batch (keys: {sorted(features)})"
        )
    if error is None and weighted and any(features[f.name].weights is None for f in infos):
        error = ConfigError("this collection is weighted but the batch has no weights")
    if error is not None:
        return JaggedBatch.empty(len(infos), size, device), error
    batch = [features[f.name] for f in infos]
    if not weighted:
        batch = [FeatureBatch(values=b.values, lengths=b.lengths) for b in batch]
    misplaced = _misplaced(batch, infos, device)
    if misplaced is not None:
        return JaggedBatch.empty(len(infos), size, device), misplaced
    return JaggedBatch.from_features(batch, size, device), None


def checked_jagged(
    batch: JaggedBatch,
    keys: Sequence[str],
    infos: Sequence[FeatureInfo],
    error: ConfigError | None,
    *,
    weighted: bool,
    device: torch.device,
) -> tuple[JaggedBatch, ConfigError | None]:
    """:func:`checked_batch` of a batch already jagged (a ``KeyedJaggedTensor``'s, whose
    features are ``keys``): its features in ``infos`` order, without a copy when they are
    the batch's in order."""
    size = batch.batch_size
    where = {k: i for i, k in enumerate(keys)}
    missing = [f.name for f in infos if f.name not in where]
    if error is None and missing:
        error = ConfigError(
            f"features {missing} are missing from the batch (keys: {sorted(keys)})"
        )
    if error is None and weighted and batch.weights is None:
        error = ConfigError("this collection is weighted but the batch has no weights")
    if error is None:
        tensors = (("IDs", batch.values), ("lengths", batch.lengths), ("weights", batch.weights))
        for what, tensor in tensors:
            if tensor is not None and tensor.device != device:
                error = _device_error(infos[0].name if infos else "?", what, tensor, device)
                break
    if error is not None:
        return JaggedBatch.empty(len(infos), size, device), error
    selected = batch.select([where[f.name] for f in infos])
    return (selected if weighted else selected.without_weights()), None


def _device_error(
    feature: str, what: str, tensor: torch.Tensor, device: torch.device
) -> ConfigError:
    return ConfigError(
        f"feature {feature!r}: its {what} are on {tensor.device} but the "
        f"engine runs on {device}; move the batch there first (e.g. "
        "Lightning's batch transfer, or .to(device))"
    )


def _misplaced(
    batch: Sequence[FeatureBatch], infos: Sequence[FeatureInfo], device: torch.device
) -> ConfigError | None:
    """The first tensor of the batch on another device than ``device``, as the error."""
    for feature, fb in zip(infos, batch, strict=True):
        named = (("IDs", fb.values), ("lengths", fb.lengths), ("weights", fb.weights))
        for what, tensor in named:
            if tensor is not None and tensor.device != device:
                return _device_error(feature.name, what, tensor, device)
    return None


def id_error(
    batch: JaggedBatch,
    infos: Sequence[FeatureInfo],
    tables: Sequence[TableInfo],
    feature_rows: torch.Tensor,
    *,
    device: torch.device,
) -> ConfigError | None:
    """The first out-of-range ID of the batch, as the error that names it.

    One comparison of every ID with its table's row count (``feature_rows``: per feature,
    on ``device``) and one host copy of the verdict; only a bad batch is searched feature
    by feature for the message.
    """
    if batch.values.numel() == 0:
        return None
    values = batch.values.to(torch.int64)
    limit = feature_rows[batch.feature_of]
    if not bool(((values < 0) | (values >= limit)).any()):
        return None
    by_name = {t.name: t for t in tables}
    for i, feature in enumerate(infos):
        fb = batch.feature(i)
        if not fb.values.numel():
            continue
        low, high = (int(x) for x in torch.stack(torch.aminmax(fb.values.to(torch.int64))))
        table = by_name[feature.table]
        bad = low if low < 0 else high if high >= table.num_rows else None
        if bad is not None:
            return ConfigError(
                f"feature {feature.name!r}: ID {bad} is out of range for table "
                f"{table.name!r} with {table.num_rows} rows (valid IDs: "
                f"0..{table.num_rows - 1}); hash or clip IDs before the embedding"
            )
    raise AssertionError("an out-of-range ID was found but no feature holds it")


def twin_group(group: Any) -> Any:
    """Another group of ``group``'s ranks, for collectives that must never interleave with
    those of ``group`` (input distributions run ahead, an engine's lane); every rank of
    ``group`` calls this at the same point, the others need not.

    A group of every rank is named by torch's group counter, which only grows, so it can
    be destroyed safely. A group of some ranks is made with local synchronization, which
    torch names by its ranks and the number of groups alive: after a group is destroyed,
    a later one can take the name of a destroyed group and read that group's stale
    addresses from the store at its rendezvous (then a connection reset, or a wait for the
    timeout). Groups of some ranks are therefore never destroyed (see
    :attr:`EmbeddingEngine.release`).
    """
    if group is None or group is dist.GroupMember.WORLD:
        ranks = list(range(dist.get_world_size()))
    else:
        ranks = dist.get_process_group_ranks(group)
    if len(ranks) == dist.get_world_size():
        return dist.new_group(ranks)
    return dist.new_group(ranks, use_local_synchronization=True)


def destroyable(group: Any) -> bool:
    """Whether :func:`twin_group` made ``group`` under a name that is never reused (a group
    of every rank), so destroying it is safe."""
    return dist.get_world_size(group) == dist.get_world_size()


def resolve_device(device: torch.device | str | None) -> torch.device:
    """``device`` as the device tensors made there report (``"cuda"`` becomes the current
    ``cuda:<index>``), so it compares equal to a batch's ``tensor.device``; None: the CPU.

    Raises:
        ConfigError: not a device torch knows, or one that cannot allocate here.
    """
    if device is None:
        return torch.device("cpu")
    try:
        return torch.empty(0, device=device).device
    except (RuntimeError, TypeError, AssertionError) as error:
        reason = (str(error).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"EmbeddingEngine(device={device!r}) is not a device tensors can be made on here "
            f"({type(error).__name__}: {reason}); pass e.g. 'cpu' or 'cuda:0'"
        ) from None


def refuse_move(convert: Callable[[torch.Tensor], torch.Tensor], device: torch.device) -> None:
    """Raise if ``convert`` (what ``nn.Module.to`` / ``cuda`` / ``cpu`` apply to every tensor)
    moves tensors off ``device``: an engine's blocks, optimizer state, streams and process
    group stay where it was built, so moving only its tower modules would split it.

    Raises:
        ConfigError: naming both devices and the fix.
    """
    moved = convert(torch.zeros(0, device=device)).device
    if moved != device:
        raise ConfigError(
            f"this EmbeddingEngine lives on {device} (its blocks, optimizer state and process "
            f"group were made for it) and cannot move to {moved}; build it with "
            f"device={str(moved)!r} instead"
        )
