"""What the engine checks before a batch's data moves, and where its groups and device come from.

Pure functions of the batch and the engine's features and tables (:class:`FeatureInfo`,
:class:`TableInfo`): a problem is returned as the :class:`ConfigError` that names it rather
than raised, because the engine must still take part in its first exchange (whose header
carries the status) so that every rank raises and none waits.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark.engine._batch import FeatureBatch
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
) -> tuple[list[FeatureBatch], ConfigError | None]:
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
        empty = FeatureBatch(
            values=torch.zeros(0, dtype=torch.int64, device=device),
            lengths=torch.zeros(size, dtype=torch.int64, device=device),
        )
        return [empty] * len(infos), error
    batch = [features[f.name] for f in infos]
    if not weighted:
        batch = [FeatureBatch(values=b.values, lengths=b.lengths) for b in batch]
    return batch, None


def id_error(
    batch: Sequence[FeatureBatch],
    infos: Sequence[FeatureInfo],
    tables: Sequence[TableInfo],
    *,
    device: torch.device,
) -> ConfigError | None:
    """The first tensor on another device than ``device``, else the first out-of-range
    ID of the batch, as the error that names it.

    Every feature's ID range comes to the host in one copy (one sync on a GPU).
    """
    for feature, fb in zip(infos, batch, strict=True):
        named = (("IDs", fb.values), ("lengths", fb.lengths), ("weights", fb.weights))
        for what, tensor in named:
            if tensor is not None and tensor.device != device:
                return ConfigError(
                    f"feature {feature.name!r}: its {what} are on {tensor.device} but the "
                    f"engine runs on {device}; move the batch there first (e.g. "
                    "Lightning's batch transfer, or .to(device))"
                )
    present = [(f, fb) for f, fb in zip(infos, batch, strict=True) if fb.values.numel()]
    if not present:
        return None
    ranges = torch.stack(
        [torch.stack(torch.aminmax(fb.values.to(torch.int64))) for _, fb in present]
    )
    by_name = {t.name: t for t in tables}
    for (feature, _), (low, high) in zip(present, ranges.tolist(), strict=True):
        table = by_name[feature.table]
        bad = low if low < 0 else high if high >= table.num_rows else None
        if bad is not None:
            return ConfigError(
                f"feature {feature.name!r}: ID {bad} is out of range for table "
                f"{table.name!r} with {table.num_rows} rows (valid IDs: "
                f"0..{table.num_rows - 1}); hash or clip IDs before the embedding"
            )
    return None


def twin_group(group: Any) -> Any:
    """Another group of ``group``'s ranks, for collectives that must never interleave with
    those of ``group`` (input distributions run ahead, an engine's lane); every rank of
    ``group`` calls this at the same point, the others need not."""
    ranks = (
        list(range(dist.get_world_size()))
        if group is None or group is dist.GroupMember.WORLD
        else dist.get_process_group_ranks(group)
    )
    return dist.new_group(ranks, use_local_synchronization=True)


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
