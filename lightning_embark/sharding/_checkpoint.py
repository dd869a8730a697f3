"""Sharded checkpoints of ``strategy="embark"`` through ``torch.distributed.checkpoint`` (DCP).

A checkpoint is a directory, as Lightning's ``FSDPStrategy`` writes them:

* DCP's ``.metadata`` and ``*.distcp`` files, holding
  - ``model/<key>``: the LightningModule's ``state_dict`` - the dense part (the sharded
    collections have no parameters). DDP keeps it identical on every rank; DCP writes one copy.
  - ``embark/<collection path>/<table>/weight``: each table as its logical full tensor
    ``[num_embeddings, dim]`` in natural row order (``<table>`` is the torchrec name),
  - ``embark/<collection path>/<table>/optimizer_state``: the sparse optimizer's state as
    ``[num_embeddings]`` (row-wise Adagrad) or ``[num_embeddings, dim]`` (Adagrad),
  - ``embark/<collection path>/towers`` (tower collections only): each ``EmbeddingTower``'s
    plan tower name and tables, in the collection's order, which
    :mod:`lightning_embark.sharding._export` needs to name the unsharded keys.
  Each rank writes the rectangles it owns, with their global offsets
  (:mod:`lightning_embark.engine._chunks` turns blocks into rectangles).
* ``meta.pt`` (rank 0, ``torch.save``): the rest of Lightning's checkpoint - loops,
  callbacks, hyper-parameters and the dense optimizers' states (replicated by DDP, so
  rank 0's copy is everyone's) - plus an ``"embark"`` entry with the plan it was saved under.

Because the tables are stored plan-independently, a checkpoint loads under any plan and
world size: each rank reads only the rows and columns of the blocks it holds.
:mod:`lightning_embark.sharding._export` reads one in a single process, for serving.

How DCP learns about the rectangles: each table is a small object implementing DCP's
``__create_write_items__`` / ``__create_chunk_list__`` hooks (what DTensor implements), and
two thin planner subclasses resolve its chunks by offset. No ``ShardedTensor`` (whose
checks forbid the overlapping reads of replicas) and no ``DTensor`` (even splits only).

Limits: saving copies each owned block once (weights and state side by side); hash-split
tables cost one ``all_to_all`` of their bytes on save and on load; Lightning's dense
optimizer state is rank 0's copy.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    TensorWriteData,
    WriteItem,
    WriteItemType,
)

from lightning_embark.engine import (
    Chunk,
    TableChunks,
    apply_chunks,
    load_targets,
    save_chunks,
    state_size,
)
from lightning_embark.errors import ConfigError
from lightning_embark.sharding._checkpoint_files import (
    check_data_files,
    load_tensors,
    read_file,
    read_metadata,
)
from lightning_embark.torchrec_modules import (
    ShardedEmbeddingBagCollection,
    ShardedEmbeddingTowerCollection,
)

log = logging.getLogger(__name__)

#: Lightning's non-tensor checkpoint content, written by rank 0 (the name FSDPStrategy uses).
META_FILE = "meta.pt"
FORMAT_VERSION = 1


class _Chunked:
    """A logical tensor of which this rank holds some rectangles, in DCP's extension hooks."""

    def __init__(self, size: tuple[int, ...], chunks: list[Chunk]) -> None:
        self._size = torch.Size(size)
        self.chunks = {torch.Size(c.offsets): c.tensor for c in chunks}

    def __create_write_items__(self, fqn: str, obj: Any) -> list[WriteItem]:
        return [
            WriteItem(
                index=MetadataIndex(fqn, offsets),
                type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offsets, sizes=tensor.size()),
                    properties=TensorProperties.create_from_tensor(tensor),
                    size=self._size,
                ),
            )
            for offsets, tensor in self.chunks.items()
        ]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=o, sizes=t.size()) for o, t in self.chunks.items()]

    def size(self) -> torch.Size:
        """The logical full size (DCP compares it with the saved one, as for tensors)."""
        return self._size

    def shard(self, offsets: Any) -> torch.Tensor:
        return self.chunks[torch.Size(offsets)]


class _SavePlanner(dcp.DefaultSavePlanner):
    def lookup_object(self, index: MetadataIndex) -> Any:
        obj = self.state_dict[index.fqn]
        return (
            obj.shard(index.offset) if isinstance(obj, _Chunked) else super().lookup_object(index)
        )


class _LoadPlanner(dcp.DefaultLoadPlanner):
    def set_up_planner(
        self, state_dict: dict[str, Any], metadata: Any = None, is_coordinator: bool = False
    ) -> None:
        # The default set-up replaces objects it does not know (ours) with None; keep them.
        chunked = {k: v for k, v in state_dict.items() if isinstance(v, _Chunked)}
        super().set_up_planner(state_dict, metadata, is_coordinator)
        state_dict.update(chunked)
        self.state_dict.update(chunked)

    def lookup_tensor(self, index: MetadataIndex) -> torch.Tensor:
        obj = self.state_dict[index.fqn]
        return (
            obj.shard(index.offset) if isinstance(obj, _Chunked) else super().lookup_tensor(index)
        )


def _key(path: str, table: str, item: str) -> str:
    return f"embark/{path}/{table}/{item}"


def towers_key(path: str) -> str:
    """The DCP key of a tower collection's tower order (see the module docstring)."""
    return f"embark/{path}/towers"


def _table_entries(
    path: str, module: ShardedEmbeddingBagCollection, tables: list[TableChunks]
) -> dict[str, _Chunked]:
    out = {}
    for config, chunks in zip(module.embedding_bag_configs(), tables, strict=True):
        out[_key(path, config.name, "weight")] = _Chunked(chunks.weight_size, chunks.weights)
        if chunks.state_size is not None:
            out[_key(path, config.name, "optimizer_state")] = _Chunked(
                chunks.state_size, chunks.states
            )
    return out


def save_sharded(
    path: Path,
    checkpoint: dict[str, Any],
    modules: Mapping[str, ShardedEmbeddingBagCollection],
    *,
    plan: Any = None,
) -> None:
    """Write Lightning's ``checkpoint`` dict and the sharded tables to directory ``path``.

    Collective: every rank calls it with the same ``path``. ``checkpoint["state_dict"]``
    goes into DCP; the rest into :data:`META_FILE` from rank 0.
    """
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
    if dist.is_initialized():
        dist.barrier()
    rest = dict(checkpoint)
    state: dict[str, Any] = {f"model/{k}": v for k, v in rest.pop("state_dict", {}).items()}
    for name, module in modules.items():
        state |= _table_entries(name, module, save_chunks(module))
        if isinstance(module, ShardedEmbeddingTowerCollection):
            state[towers_key(name)] = module.unsharded_towers
    dcp.save(state, checkpoint_id=path, planner=_SavePlanner())
    if rank == 0:
        rest["embark"] = {
            "format": FORMAT_VERSION,
            "plan": plan.to_dict() if plan is not None else None,
            "collections": {
                name: [c.name for c in m.embedding_bag_configs()] for name, m in modules.items()
            },
        }
        torch.save(rest, path / META_FILE)


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a directory written by :func:`save_sharded`."""
    return path.is_dir() and (path / META_FILE).is_file() and (path / ".metadata").is_file()


def load_sharded(
    path: Path,
    module: torch.nn.Module,
    modules: Mapping[str, ShardedEmbeddingBagCollection],
    *,
    strict: bool = True,
    load_meta: Callable[[Path], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Load the tables (and sparse-optimizer state) into ``modules``; return Lightning's dict.

    The returned dict holds ``"state_dict"`` (the dense state, read here, for Lightning to
    load into the module) and everything :func:`save_sharded` put into :data:`META_FILE`.
    Collective. Raises :class:`ConfigError`, before reading any tensor, when the
    checkpoint's tables or dense parameters do not match the model, and
    :class:`~lightning_embark.errors.CheckpointError` naming the file when one of the
    directory's files is missing, truncated or corrupt.
    """
    if not is_sharded_checkpoint(path):
        raise ConfigError(
            f"{str(path)!r} is not a checkpoint written by strategy='embark' (a directory with "
            f"{META_FILE} and DCP's .metadata); single-file checkpoints of other strategies "
            "cannot be resumed"
        )
    metadata = read_metadata(path)
    check_data_files(path, metadata)
    saved = metadata.state_dict_metadata
    dense = {
        f"model/{k}": v.detach().clone()
        for k, v in module.state_dict().items()
        if isinstance(v, torch.Tensor)
    }
    _check_matches(path, saved, dense, modules, strict=strict)
    state: dict[str, Any] = {k: v for k, v in dense.items() if k in saved}
    targets: dict[str, list[TableChunks]] = {}
    for name, sharded in modules.items():
        configs = sharded.embedding_bag_configs()
        with_state = {}
        for config, table in zip(configs, sharded.table_infos, strict=True):
            md = saved.get(_key(name, config.name, "optimizer_state"))
            expected = state_size(sharded.sparse_optimizer.kind, table)
            with_state[table.name] = isinstance(md, TensorStorageMetadata) and expected == tuple(
                md.size
            )
            if expected is not None and not with_state[table.name]:
                log.warning(
                    "checkpoint %s has no %s optimizer state %s for table %r (saved with another "
                    "sparse optimizer?); the table keeps its current (initial) state",
                    path,
                    sharded.sparse_optimizer.kind.value,
                    expected,
                    config.name,
                )
        targets[name] = load_targets(sharded, with_state=with_state)
        state |= _table_entries(name, sharded, targets[name])
    load_tensors(path, lambda: dcp.load(state, checkpoint_id=path, planner=_LoadPlanner()))
    for name, sharded in modules.items():
        apply_chunks(sharded, targets[name])
    meta = read_file(
        path / META_FILE,
        path,
        load_meta or (lambda p: torch.load(p, map_location="cpu", weights_only=False)),
    )
    meta["state_dict"] = {
        k.removeprefix("model/"): v for k, v in state.items() if k.startswith("model/")
    }
    return meta


#: A tower module's parameter in a torchrec EmbeddingTowerCollection, ``towers.<i>.interaction``
#: (``towers.<prefix>_<i>.interaction`` once sharded).
_TOWER_MODULE = re.compile(r"\.towers\.(?:\w*_)?(\d+)\.interaction\.")


def _check_matches(
    path: Path,
    saved: Mapping[str, Any],
    dense: Mapping[str, torch.Tensor],
    modules: Mapping[str, ShardedEmbeddingBagCollection],
    *,
    strict: bool,
) -> None:
    """Raise one ConfigError listing every table / dense tensor the checkpoint does not match
    (and, when tower modules differ, which towers and what to do)."""
    problems = []
    towers: set[str] = set()
    expected_tables = {}
    for name, sharded in modules.items():
        for config in sharded.embedding_bag_configs():
            expected_tables[_key(name, config.name, "weight")] = (
                config.num_embeddings,
                config.embedding_dim,
            )
    saved_tables = {k for k in saved if k.startswith("embark/") and k.endswith("/weight")}
    for key, shape in expected_tables.items():
        label = key.removeprefix("embark/").removesuffix("/weight")
        if key not in saved:
            problems.append(f"table {label!r} {shape} is missing from the checkpoint")
        elif tuple(saved[key].size) != shape:
            problems.append(
                f"table {label!r} is {tuple(saved[key].size)} in the checkpoint but {shape} in "
                "the model"
            )
    for key in sorted(saved_tables - set(expected_tables)):
        label = key.removeprefix("embark/").removesuffix("/weight")
        problems.append(
            f"table {label!r} {tuple(saved[key].size)} is in the checkpoint but not in the model"
        )
    for key, value in dense.items():
        md = saved.get(key)
        if md is None:
            if strict:
                problems.append(
                    f"dense tensor {key.removeprefix('model/')!r} is missing from the checkpoint"
                )
        elif not isinstance(md, TensorStorageMetadata) or tuple(md.size) != tuple(value.shape):
            size = tuple(md.size) if isinstance(md, TensorStorageMetadata) else "not a tensor"
            problems.append(
                f"dense tensor {key.removeprefix('model/')!r} is {size} in the checkpoint but "
                f"{tuple(value.shape)} in the model"
            )
            towers.update(_TOWER_MODULE.findall(key))
    if strict:
        for key in sorted(k for k in saved if k.startswith("model/") and k not in dense):
            problems.append(
                f"dense tensor {key.removeprefix('model/')!r} is in the checkpoint but not in the "
                "model"
            )
    if towers:
        problems.append(
            f"the tower modules of towers {sorted(int(t) for t in towers)} have other shapes "
            "than when the checkpoint was written (another tower module or output width): "
            "build the model with the towers file it was trained with "
            "(DLRMConfig(towers=...)), or start the tower modules from scratch"
        )
    if problems:
        raise ConfigError(
            f"checkpoint {str(path)!r} was saved from another model: " + "; ".join(problems)
        )
