"""A trained model as one file for serving: the full unsharded ``state_dict``.

A checkpoint of ``strategy="embark"`` is a directory of pieces keyed by the *sharded*
module: each table as ``embark/<collection path>/<table>/weight``, the dense part as
``model/<key>`` of the LightningModule whose collections the strategy replaced (they
hold no parameters). Serving wants one file that a plain process loads into the model as
the user built it. :func:`unsharded_state_dict` maps one onto the other:

* a table of an ``EmbeddingBagCollection`` at path ``P``: ``P.embedding_bags.<table>.weight``;
* a table in tower ``i`` of an ``EmbeddingTowerCollection`` at ``P``:
  ``P.towers.<i>.embedding.embedding_bags.<table>.weight``; the tower's module, which the
  sharded collection keeps as ``P.towers.<plan tower name>.<rest>``, becomes
  ``P.towers.<i>.<rest>`` (the order is the checkpoint's ``embark/<P>/towers`` entry);
* every other dense key as it is.

The values are the trained tensors themselves, moved and never recomputed, so the file
holds them bit for bit. :func:`export_model` builds it from a checkpoint directory in one
process (no process group); :func:`export_sharded` from a run's live sharded modules
(every rank sends its table rectangles to rank 0). :func:`load_exported` loads it into a
module whose tables are still on the ``meta`` device, where a plain ``load_state_dict``
copies into nothing (``assign=True`` replaces the meta tensors instead).

Limits: the whole model is held in memory by the process that writes the file (rank 0
for :func:`export_sharded`, which also holds the gathered rectangles until they are
placed); the sparse optimizer's state is left out, as serving needs none.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

from lightning_embark.engine import save_chunks
from lightning_embark.errors import ConfigError
from lightning_embark.sharding._checkpoint import is_sharded_checkpoint, towers_key
from lightning_embark.sharding._checkpoint_files import (
    check_data_files,
    load_tensors,
    read_metadata,
)
from lightning_embark.torchrec_modules import (
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingTowerCollection,
)

M = TypeVar("M", bound=nn.Module)
#: Collection path -> its towers in the unsharded collection's order: (plan tower name,
#: torchrec table names).
TowerOrder = Mapping[str, Sequence[tuple[str, Sequence[str]]]]


def unsharded_state_dict(
    dense: Mapping[str, Any],
    tables: Mapping[str, Mapping[str, torch.Tensor]],
    towers: TowerOrder,
) -> dict[str, Any]:
    """The unsharded module's ``state_dict`` from the sharded one's dense entries, the full
    tables (by collection path, then torchrec table name) and the tower collections'
    order (module docstring)."""
    renames = {
        f"{path}.towers.{name}.": f"{path}.towers.{i}."
        for path, order in towers.items()
        for i, (name, _) in enumerate(order)
    }
    out: dict[str, Any] = {}
    for key, value in dense.items():
        prefix = next((p for p in renames if key.startswith(p)), None)
        out[key if prefix is None else renames[prefix] + key[len(prefix) :]] = value
    for path, by_table in tables.items():
        tower_of = {t: i for i, (_, names) in enumerate(towers.get(path, ())) for t in names}
        for table, weight in by_table.items():
            where = f"{path}.towers.{tower_of[table]}.embedding" if path in towers else path
            out[f"{where}.embedding_bags.{table}.weight"] = weight
    return out


def _checkpoint_dir(checkpoint_dir: str | Path) -> Path:
    path = Path(checkpoint_dir)
    if not is_sharded_checkpoint(path):
        raise ConfigError(
            f"{str(path)!r} is not a checkpoint written by strategy='embark' (a directory with "
            "meta.pt and DCP's .metadata); pass the checkpoint directory itself, e.g. "
            "'checkpoints/epoch=0-step=100.ckpt'"
        )
    return path


def _read(path: Path, wanted: Sequence[str], saved: Mapping[str, Any]) -> dict[str, Any]:
    """The entries ``wanted`` of checkpoint ``path``, read in this process's host memory."""
    state: dict[str, Any] = {}
    for key in wanted:
        md = saved[key]
        if isinstance(md, TensorStorageMetadata):
            state[key] = torch.empty(tuple(md.size), dtype=md.properties.dtype, device="cpu")
        else:
            assert isinstance(md, BytesStorageMetadata), (key, md)
            state[key] = None  # DCP unpickles the object in its place
    load_tensors(path, lambda: dcp.load(state, checkpoint_id=path, no_dist=True))
    return state


def read_tables(
    checkpoint_dir: str | Path, *, optimizer_state: bool = False
) -> dict[str, dict[str, torch.Tensor]]:
    """Full tables of a checkpoint, by collection path then ``<table>`` or
    ``<table>/optimizer_state``.

    Reads whole tables into this process's memory; no process group needed.

    Raises:
        ConfigError: the directory is not such a checkpoint.
        CheckpointError: one of its files is missing, truncated or corrupt (named).
    """
    path = _checkpoint_dir(checkpoint_dir)
    metadata = read_metadata(path)
    check_data_files(path, metadata)
    saved = metadata.state_dict_metadata
    wanted = [
        k
        for k, md in saved.items()
        if k.startswith("embark/")
        and isinstance(md, TensorStorageMetadata)
        and (k.endswith("/weight") or (optimizer_state and k.endswith("/optimizer_state")))
    ]
    out: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in _read(path, wanted, saved).items():
        collection, table, item = key.removeprefix("embark/").rsplit("/", 2)
        out.setdefault(collection, {})[table if item == "weight" else f"{table}/{item}"] = tensor
    return out


def export_tables(
    checkpoint_dir: str | Path,
    out_path: str | Path | None = None,
    *,
    collection: str | None = None,
) -> dict[str, torch.Tensor]:
    """Unsharded tables of one collection as an ``EmbeddingBagCollection`` ``state_dict``.

    Keys are torchrec's (``embedding_bags.<table>.weight``). A collection built on the
    ``meta`` device takes them with ``ebc.load_state_dict(tables, assign=True)`` (a plain
    copy into a meta tensor does nothing). :func:`export_model` exports the whole model.
    Optimizer state is left out. Reads whole tables into memory; no process group needed.

    Args:
        checkpoint_dir: A checkpoint directory written by ``strategy="embark"``.
        out_path: If given, the state dict is also written there with ``torch.save``.
        collection: The collection's path in the LightningModule; needed only when the
            model has several.
    """
    tables = read_tables(checkpoint_dir)
    if collection is None:
        if len(tables) != 1:
            raise ConfigError(
                f"the checkpoint holds collections {sorted(tables)}; name one with collection="
            )
        collection = next(iter(tables))
    if collection not in tables:
        raise ConfigError(
            f"collection {collection!r} is not in the checkpoint (it holds {sorted(tables)})"
        )
    out = {f"embedding_bags.{name}.weight": weight for name, weight in tables[collection].items()}
    if out_path is not None:
        torch.save(out, Path(out_path))
    return out


def read_model(checkpoint_dir: str | Path) -> dict[str, Any]:
    """The full unsharded model ``state_dict`` of a checkpoint directory (what
    :func:`export_model` writes), read in this process.

    Raises:
        ConfigError: the directory is not such a checkpoint, or it holds tower modules
            but not their towers' order (a checkpoint saved before it was recorded).
        CheckpointError: one of its files is missing, truncated or corrupt (named).
    """
    path = _checkpoint_dir(checkpoint_dir)
    metadata = read_metadata(path)
    check_data_files(path, metadata)
    saved = metadata.state_dict_metadata
    tables = read_tables(path)
    orders = _read(path, [towers_key(c) for c in tables if towers_key(c) in saved], saved)
    dense = _read(path, [k for k in saved if k.startswith("model/")], saved)
    dense = {k.removeprefix("model/"): v for k, v in dense.items()}
    towers = {c: orders[towers_key(c)] for c in tables if towers_key(c) in orders}
    unordered = sorted(
        c for c in tables if c not in towers and any(k.startswith(f"{c}.towers.") for k in dense)
    )
    if unordered:
        raise ConfigError(
            f"checkpoint {str(path)!r} holds tower modules of {unordered} but not their towers' "
            "order (it was saved before that was recorded): resume it with strategy='embark' "
            "and save it again, or export from that run with trainer.strategy.export(path)"
        )
    return unsharded_state_dict(dense, tables, towers)


def export_model(checkpoint_dir: str | Path, out_path: str | Path) -> dict[str, Any]:
    """Write the full unsharded model ``state_dict`` of a checkpoint directory to one file.

    The file is a plain ``torch.save`` of tensors: ``torch.load(out_path)`` and
    ``module.load_state_dict(..., assign=True)`` (or :func:`load_exported`) load it into
    the LightningModule as built, unsharded, with the trained weights bit for bit. No
    process group needed.

    Returns:
        The state dict written.
    """
    state = read_model(checkpoint_dir)
    _write(state, out_path)
    return state


def _write(state: Mapping[str, Any], out_path: str | Path) -> None:
    """``torch.save`` to ``out_path``, creating its directory (as a checkpoint save does)."""
    path = Path(out_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(dict(state), path)


def tower_order(modules: Mapping[str, ShardedEmbeddingBagCollection]) -> dict[str, Any]:
    """The tower collections' order among ``modules`` (module docstring)."""
    return {
        path: module.unsharded_towers
        for path, module in modules.items()
        if isinstance(module, ShardedEmbeddingTowerCollection)
    }


def export_sharded(
    out_path: str | Path,
    dense: Mapping[str, Any],
    modules: Mapping[str, ShardedEmbeddingBagCollection],
) -> None:
    """Write the unsharded model ``state_dict`` of a running sharded model from rank 0.

    Collective: every rank calls it with the same arguments, after the same steps. Each
    rank sends the table rectangles it owns (replica group 0's, as a checkpoint saves
    them; hash-split tables first cost their swap to contiguous rows) to rank 0, which
    places them, adds ``dense`` (the LightningModule's ``state_dict``, the same on every
    rank) and writes the file. Returns once the file is written, on every rank.
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    # Rectangles travel pickled, so they go on the host first: a pickled CUDA tensor would
    # unpickle onto the sender's GPU index on rank 0. The file is for serving (host memory).
    mine = {
        path: [
            (
                config.name,
                chunks.weight_size,
                [(c.offsets, c.tensor.detach().cpu()) for c in chunks.weights],
            )
            for config, chunks in zip(
                module.embedding_bag_configs(), save_chunks(module), strict=True
            )
        ]
        for path, module in modules.items()
    }
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is not None:
        tables = _placed(gathered)
        _write(unsharded_state_dict(dense, tables, tower_order(modules)), out_path)
    dist.barrier()


def _placed(gathered: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, torch.Tensor]]:
    """Full tables from every rank's rectangles ``(offsets, tensor)``: they are disjoint
    (only replica group 0 sends) and together cover each table once."""
    sizes: dict[tuple[str, str], tuple[int, int]] = {}
    rectangles: dict[tuple[str, str], list[Any]] = {}
    for per_rank in gathered:
        for path, entries in per_rank.items():
            for name, size, pieces in entries:
                sizes[path, name] = size
                rectangles.setdefault((path, name), []).extend(pieces)
    tables: dict[str, dict[str, torch.Tensor]] = {}
    for (path, name), size in sizes.items():
        pieces = rectangles[path, name]
        assert sum(t.numel() for _, t in pieces) == size[0] * size[1], (path, name)
        full = torch.empty(size, dtype=pieces[0][1].dtype, device="cpu")
        for (row, col), tensor in pieces:
            full[row : row + tensor.shape[0], col : col + tensor.shape[1]] = tensor
        tables.setdefault(path, {})[name] = full
    return tables


def load_exported(module: M, path: str | Path) -> M:
    """Load a file of :func:`export_model` / :func:`export_sharded` into ``module`` (built as
    for training, unsharded; its tables may be on the ``meta`` device) and return it.

    ``load_state_dict(strict=True, assign=True)``: every tensor of the module's
    ``state_dict`` is replaced by the file's, so nothing is copied into a meta tensor (a
    no-op that leaves the table unallocated); a key the file lacks or adds raises
    ``load_state_dict``'s error naming it.
    """
    state = torch.load(Path(path), map_location="cpu", weights_only=True)
    module.load_state_dict(state, strict=True, assign=True)
    return module
