"""Sharded blocks <-> rectangles of logical full tables: the resharding half of checkpoints.

A checkpoint stores every table as its logical full tensor ``[num_embeddings, dim]``
in natural row order, and its sparse-optimizer state as ``[num_embeddings]``
(row-wise Adagrad) or ``[num_embeddings, dim]`` (Adagrad), written as rectangular
chunks with global offsets. Natural order is what makes a checkpoint independent of
the plan: any plan on any world size finds its rows at the same offsets.

* Unsplit and range-split blocks already are rectangles of the full table.
* Hash-split blocks (rows ``i, i + k, i + 2k, ...``) are not. On save, the owners of a
  replica group's blocks swap rows so that block ``(i, j)``'s owner holds the
  *contiguous* range ``i`` (``layout.row_range``, which has exactly as many rows as hash
  shard ``i``); on load, block ``(g, i, j)``'s owner reads range ``i`` and the swap runs
  backwards. Each is one ``all_to_all`` per hash-split table, of the table's own bytes.

Only replica group 0 writes (replicas hold identical copies; DP tables: rank 0), and
row-wise state only from column shard 0 (it is the whole row's state, the same in every
column shard). Every rank reads exactly the rows and columns of the blocks it holds.

Rectangles, swap buffers and the swap's counts live on the engine's device (the
collectives' device); the counts come to the host once, as split sizes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from lightning_embark.engine._engine import EmbeddingEngine
from lightning_embark.engine._local_shards import LocalShard
from lightning_embark.engine._optimizer import OptimizerKind
from lightning_embark.engine._routing import TableInfo
from lightning_embark.plan import RowSplit


@dataclass(frozen=True, kw_only=True)
class Chunk:
    """A rectangle of a logical full tensor at global ``offsets`` (its size is the tensor's)."""

    offsets: tuple[int, ...]
    tensor: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class TableChunks:
    """This rank's rectangles of one table: weights and (if the optimizer has any) its state.

    Attributes:
        table: The plan's table name.
        weight_size: ``(num_embeddings, dim)``.
        weights: Rectangles of the weight table.
        state_size: ``(num_embeddings,)`` row-wise, ``(num_embeddings, dim)`` element-wise,
            None when the optimizer keeps no state.
        states: Rectangles of the state.
    """

    table: str
    weight_size: tuple[int, int]
    weights: list[Chunk]
    state_size: tuple[int, ...] | None
    states: list[Chunk]


def state_size(kind: OptimizerKind, table: TableInfo) -> tuple[int, ...] | None:
    """The logical full shape of a table's optimizer state under optimizer ``kind``."""
    if kind is OptimizerKind.ROWWISE_ADAGRAD:
        return (table.num_rows,)
    if kind is OptimizerKind.ADAGRAD:
        return (table.num_rows, table.dim)
    return None


def _hashed(table: TableInfo) -> bool:
    return table.layout.row_split is RowSplit.HASH and table.layout.num_row_shards > 1


def _range(table: TableInfo, row_shard: int) -> tuple[int, int]:
    return table.layout.row_range(row_shard, table.num_rows)


def _payload(shard: LocalShard, with_state: bool) -> torch.Tensor:
    """Weights with the state appended as extra columns (one for row-wise state)."""
    if not with_state or shard.optimizer_state is None:
        return shard.weight
    state = shard.optimizer_state
    return torch.cat([shard.weight, state.unsqueeze(1) if state.dim() == 1 else state], dim=1)


def _chunks(
    table: TableInfo,
    row_shard: int,
    col_start: int,
    width: int,
    data: torch.Tensor,
    size: tuple[int, ...] | None,
    *,
    col_shard: int,
    for_state: bool,
) -> list[Chunk]:
    """The weight (or state) rectangle of natural range ``row_shard`` held in ``data``."""
    start, _ = _range(table, row_shard)
    if not for_state:
        return [Chunk(offsets=(start, col_start), tensor=data[:, :width])]
    if size is None or (len(size) == 1 and col_shard != 0):
        return []
    if len(size) == 1:
        return [Chunk(offsets=(start,), tensor=data[:, width])]
    return [Chunk(offsets=(start, col_start), tensor=data[:, width:])]


def save_chunks(module: EmbeddingEngine) -> list[TableChunks]:
    """What this rank writes of every table, in natural row order (collective: hash swaps).

    Every rank of the module's group must call it, in the same order as its peers.
    """
    kind = module.sparse_optimizer.kind
    shards = module.local_shards()
    out = []
    for table in module.table_infos:
        size = state_size(kind, table)
        mine = [s for s in shards if s.table == table.name and s.replica == 0]
        if _hashed(table):
            sends = [
                (0, s.row_shard, s.col_shard, s.rows, _payload(s, size is not None)) for s in mine
            ]
            received = _swap(
                table,
                sends,
                to_hash=False,
                receive=[(0, s.row_shard, s.col_shard) for s in mine],
                width=_width(table, size),
                group=module.process_group,
                device=module.device,
            )
            datas = [received[(0, s.row_shard, s.col_shard)] for s in mine]
        else:
            datas = [_payload(s, size is not None) for s in mine]
        weights, states = [], []
        for s, data in zip(mine, datas, strict=True):
            if data.shape[0] == 0:
                continue
            width = s.col_end - s.col_start
            weights += _chunks(
                table,
                s.row_shard,
                s.col_start,
                width,
                data,
                size,
                col_shard=s.col_shard,
                for_state=False,
            )
            states += _chunks(
                table,
                s.row_shard,
                s.col_start,
                width,
                data,
                size,
                col_shard=s.col_shard,
                for_state=True,
            )
        out.append(
            TableChunks(
                table=table.name,
                weight_size=(table.num_rows, table.dim),
                weights=weights,
                state_size=size,
                states=states,
            )
        )
    return out


def load_targets(module: EmbeddingEngine, *, with_state: dict[str, bool]) -> list[TableChunks]:
    """Empty rectangles this rank must read (per table; fill them, then :func:`apply_chunks`).

    Block ``(g, i, j)`` reads natural range ``i`` of its columns; for a hash-split table
    that range holds other blocks' rows, which :func:`apply_chunks` swaps into place.
    Identical rectangles (row-wise state of several column shards) are read once. The
    rectangles are on the module's device.
    """
    kind = module.sparse_optimizer.kind
    device = module.device
    shards = module.local_shards()
    out = []
    for table in module.table_infos:
        size = state_size(kind, table) if with_state.get(table.name, False) else None
        weights: dict[tuple, Chunk] = {}
        states: dict[tuple, Chunk] = {}
        for s in (s for s in shards if s.table == table.name):
            start, end = _range(table, s.row_shard)
            width = s.col_end - s.col_start
            if end == start:
                continue
            weights.setdefault(
                (start, s.col_start),
                Chunk(
                    offsets=(start, s.col_start),
                    tensor=torch.zeros(end - start, width, device=device),
                ),
            )
            if size is not None and len(size) == 1:
                states.setdefault(
                    (start,),
                    Chunk(offsets=(start,), tensor=torch.zeros(end - start, device=device)),
                )
            elif size is not None:
                states.setdefault(
                    (start, s.col_start),
                    Chunk(
                        offsets=(start, s.col_start),
                        tensor=torch.zeros(end - start, width, device=device),
                    ),
                )
        out.append(
            TableChunks(
                table=table.name,
                weight_size=(table.num_rows, table.dim),
                weights=list(weights.values()),
                state_size=size,
                states=list(states.values()),
            )
        )
    return out


def apply_chunks(module: EmbeddingEngine, loaded: list[TableChunks]) -> None:
    """Copy filled :func:`load_targets` rectangles into the blocks (collective: hash swaps)."""
    shards = module.local_shards()
    device = module.device
    by_table = {t.table: t for t in loaded}
    blocks: dict[tuple[str, int, int, int], torch.Tensor] = {}
    for table in module.table_infos:
        chunks = by_table[table.name]
        weights = {c.offsets: c.tensor for c in chunks.weights}
        states = {c.offsets: c.tensor for c in chunks.states}
        mine = [s for s in shards if s.table == table.name]
        datas = []
        for s in mine:
            start, end = _range(table, s.row_shard)
            if end == start:
                datas.append(torch.zeros(0, _width(table, chunks.state_size), device=device))
                continue
            parts = [weights[(start, s.col_start)]]
            if chunks.state_size is not None:
                state = (
                    states[(start,)]
                    if len(chunks.state_size) == 1
                    else states[(start, s.col_start)]
                )
                parts.append(state.unsqueeze(1) if state.dim() == 1 else state)
            datas.append(torch.cat(parts, dim=1))
        if _hashed(table):
            sends = [
                (
                    s.replica,
                    s.row_shard,
                    s.col_shard,
                    torch.arange(*_range(table, s.row_shard), device=device),
                    d,
                )
                for s, d in zip(mine, datas, strict=True)
            ]
            received = _swap(
                table,
                sends,
                to_hash=True,
                receive=[(s.replica, s.row_shard, s.col_shard) for s in mine],
                width=_width(table, chunks.state_size),
                group=module.process_group,
                device=device,
            )
            datas = [received[(s.replica, s.row_shard, s.col_shard)] for s in mine]
        for s, data in zip(mine, datas, strict=True):
            blocks[(s.table, s.replica, s.row_shard, s.col_shard)] = data
    new_weights: list[torch.Tensor] = []
    new_states: list[torch.Tensor | None] = []
    for s in shards:
        data = blocks[(s.table, s.replica, s.row_shard, s.col_shard)]
        width = s.col_end - s.col_start
        new_weights.append(data[:, :width])
        if by_table[s.table].state_size is None or s.optimizer_state is None:
            new_states.append(None)
        else:
            new_states.append(data[:, width] if s.optimizer_state.dim() == 1 else data[:, width:])
    module.load_local_shards(new_weights, new_states)


def _width(table: TableInfo, size: tuple[int, ...] | None) -> int:
    """Payload columns of a block: its width, plus one (row-wise) or width (element-wise) state
    columns."""
    width = table.dim // table.layout.num_col_shards
    return width + (0 if size is None else 1 if len(size) == 1 else width)


def _swap(
    table: TableInfo,
    sends: list[tuple[int, int, int, torch.Tensor, torch.Tensor]],
    *,
    to_hash: bool,
    receive: list[tuple[int, int, int]],
    width: int,
    group: Any,
    device: torch.device,
) -> dict[tuple[int, int, int], torch.Tensor]:
    """Move rows between hash blocks and natural ranges of one table, within each replica group.

    Args:
        table: A hash-split table.
        sends: ``(replica, row_shard, col_shard, global rows, payload)`` this rank holds.
        to_hash: True: rows go to the hash block ``(g, row % k, j)`` at local ``row // k``;
            False: to the holder of natural range ``i`` (block ``(g, i, j)``'s owner).
        receive: The ``(replica, row_shard, col_shard)`` slots this rank fills.
        width: Payload columns (block width plus state columns), the same on every rank.
        group: The module's process group (ranks in the layout index it).
        device: The module's device: rows, payloads, keys and counts are there (the
            collectives' device); the counts come to the host once, as split sizes.

    Returns:
        Per slot of ``receive``, its rows in local order.
    """
    layout = table.layout
    k, c, n = layout.num_row_shards, layout.num_col_shards, max(table.num_rows, 1)
    world = dist.get_world_size(group)
    outgoing: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in range(world)]
    for g, _, j, rows, payload in sends:
        assert payload.shape[1] == width, (table.name, payload.shape, width)
        assert rows.device == payload.device == device, (rows.device, payload.device, device)
        if to_hash:
            shard, position = rows % k, torch.div(rows, k, rounding_mode="floor")
        else:
            starts = table.range_starts_on(device)
            shard = torch.bucketize(rows, starts[1:], right=True)
            position = rows - starts[shard]
        owners = torch.tensor(layout.ranks[g], dtype=torch.int64, device=device)[shard * c + j]
        keys = ((g * k + shard) * c + j) * n + position
        for dest in owners.unique().tolist():
            mask = owners == dest
            outgoing[dest].append((keys[mask], payload[mask]))
    send_keys = torch.cat(
        [k_ for parts in outgoing for k_, _ in parts]
        or [torch.zeros(0, dtype=torch.int64, device=device)]
    )
    send_data = torch.cat(
        [d for parts in outgoing for _, d in parts] or [torch.zeros(0, width, device=device)]
    ).float()
    send_split = [sum(int(k_.numel()) for k_, _ in parts) for parts in outgoing]
    send_counts = torch.tensor(send_split, dtype=torch.int64, device=device)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    recv_split = recv_counts.tolist()  # one host copy: the split sizes of both exchanges
    total = sum(recv_split)
    recv_keys = torch.empty(total, dtype=torch.int64, device=device)
    dist.all_to_all_single(recv_keys, send_keys, recv_split, send_split, group=group)
    recv_data = torch.empty(total, width, device=device)
    dist.all_to_all_single(recv_data, send_data.contiguous(), recv_split, send_split, group=group)
    out = {}
    block_of = torch.div(recv_keys, n, rounding_mode="floor")
    for g, i, j in receive:
        num_rows = layout.shard_rows(i, table.num_rows)
        mask = block_of == (g * k + i) * c + j
        assert int(mask.sum()) == num_rows, (table.name, g, i, j, int(mask.sum()), num_rows)
        buffer = torch.zeros(num_rows, width, device=device)
        buffer[recv_keys[mask] % n] = recv_data[mask]
        out[(g, i, j)] = buffer
    return out
