"""Which rows and column blocks go to (or come from) which peer rank, in buffer order.

One :class:`ExchangeLayout` describes one side of a fused exchange. For a pack it
says, for each destination rank in rank order, which rows of the dense input and
which of its column blocks are sent; for an unpack it says, for each source rank,
where its blocks land in the output. The byte buffer holds the ranks' parts
contiguously; inside a rank, one *segment* per column block, each a run of
``num_rows`` wire rows of :meth:`Codec.row_bytes` bytes (the codecs module's
format), so every segment is exactly what ``codec.encode`` makes of the block.

Kernels and custom ops take the layout flattened to :meth:`ExchangeLayout.segments`
(four ints per non-empty segment), so ``torch.compile`` sees plain integer lists.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from lightning_embark.errors import ConfigError
from lightning_embark.wire import Codec

#: Ints per segment in a flattened layout: row_start, num_rows, col_start, width.
SEGMENT_FIELDS = 4


@dataclass(frozen=True, kw_only=True)
class ColumnBlock:
    """Columns ``[start, start + width)``: one table's column shard in the pooled layout."""

    start: int
    width: int

    def __post_init__(self) -> None:
        if self.start < 0 or self.width < 1:
            raise ConfigError(
                f"column block (start={self.start}, width={self.width}) needs start >= 0 and "
                "width >= 1"
            )

    @property
    def stop(self) -> int:
        return self.start + self.width


@dataclass(frozen=True, kw_only=True)
class RankSlice:
    """What one peer rank gets: rows ``[row_start, row_stop)`` of every listed block.

    Attributes:
        row_start: First row of the dense tensor.
        row_stop: One past the last row; ``row_start == row_stop`` sends nothing.
        blocks: Column blocks in buffer order; ``(start, width)`` pairs are accepted.
    """

    row_start: int
    row_stop: int
    blocks: tuple[ColumnBlock, ...] = ()

    def __post_init__(self) -> None:
        blocks = tuple(
            b if isinstance(b, ColumnBlock) else ColumnBlock(start=b[0], width=b[1])
            for b in self.blocks
        )
        object.__setattr__(self, "blocks", blocks)
        if not 0 <= self.row_start <= self.row_stop:
            raise ConfigError(
                f"rank slice rows [{self.row_start}, {self.row_stop}) must satisfy 0 <= start <= "
                "stop"
            )

    @property
    def num_rows(self) -> int:
        return self.row_stop - self.row_start


@dataclass(frozen=True, kw_only=True)
class ExchangeLayout:
    """One side of a fused exchange: a :class:`RankSlice` per peer rank, in rank order.

    Attributes:
        ranks: One entry per peer rank (index = rank): a :class:`RankSlice`, or a tuple
            of them laid out one after another when a peer's blocks come from different
            rows (the unique-row requester: one run of unique IDs per table).
        num_rows: Rows of the dense side (the packed input or the unpacked output).
        num_cols: Columns of the dense side (``sum(d)`` of the cluster's tables).
    """

    ranks: tuple[RankSlice | tuple[RankSlice, ...], ...]
    num_rows: int
    num_cols: int
    _segments: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "ranks", tuple(e if isinstance(e, RankSlice) else tuple(e) for e in self.ranks)
        )
        if self.num_rows < 0 or self.num_cols < 1:
            raise ConfigError(
                f"layout shape ({self.num_rows}, {self.num_cols}) needs rows >= 0, cols >= 1"
            )
        flat: list[int] = []
        for rank, part in ((r, part) for r in range(len(self.ranks)) for part in self.parts(r)):
            if part.row_stop > self.num_rows:
                raise ConfigError(
                    f"rank {rank}: rows [{part.row_start}, {part.row_stop}) exceed the layout's "
                    f"{self.num_rows} rows; shrink the slice or grow num_rows"
                )
            for block in part.blocks:
                if block.stop > self.num_cols:
                    raise ConfigError(
                        f"rank {rank}: column block [{block.start}, {block.stop}) exceeds the "
                        f"layout's {self.num_cols} columns"
                    )
                if part.num_rows:
                    flat += [part.row_start, part.num_rows, block.start, block.width]
        object.__setattr__(self, "_segments", tuple(flat))

    @classmethod
    def from_row_splits(
        cls,
        rows_per_rank: Sequence[int],
        blocks: Sequence[ColumnBlock | tuple[int, int]],
        num_cols: int,
    ) -> ExchangeLayout:
        """Rank ``p`` gets the ``p``-th contiguous run of rows and every block.

        This is the RB pattern: an owner sends each requester its samples' rows of
        all the column blocks it owns, and a requester receives its rows of every
        block from every owner (row shards then reduce on arrival).
        """
        ranks, start = [], 0
        for count in rows_per_rank:
            ranks.append(RankSlice(row_start=start, row_stop=start + count, blocks=tuple(blocks)))  # type: ignore[arg-type]  # pairs are converted
            start += count
        return cls(ranks=tuple(ranks), num_rows=start, num_cols=num_cols)

    def parts(self, rank: int) -> tuple[RankSlice, ...]:
        """Peer ``rank``'s slices in buffer order."""
        entry = self.ranks[rank]
        return (entry,) if isinstance(entry, RankSlice) else entry

    @property
    def segments(self) -> tuple[int, ...]:
        """Flattened non-empty segments in buffer order: (row_start, num_rows, col_start,
        width)."""
        return self._segments

    def split_bytes(self, codec: Codec) -> list[int]:
        """Bytes per peer rank: the ``all_to_all_single`` split sizes of the byte buffer."""
        return [
            sum(
                part.num_rows * sum(codec.row_bytes(b.width) for b in part.blocks)
                for part in self.parts(rank)
            )
            for rank in range(len(self.ranks))
        ]

    def total_bytes(self, codec: Codec) -> int:
        return sum(self.split_bytes(codec))

    @cached_property
    def reduction_groups(self) -> tuple[tuple[tuple[int, int, int, int], tuple[int, ...]], ...]:
        """Output blocks and the segments (buffer order) summed into each.

        Segments covering exactly the same rows and columns (partial results of row
        shards) reduce; segments must otherwise be disjoint.

        Raises:
            ConfigError: Two different segments overlap partially.
        """
        return reduction_groups(self.segments)


def iter_segments(segments: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Flattened segments back as (row_start, num_rows, col_start, width) tuples."""
    if len(segments) % SEGMENT_FIELDS:
        raise ConfigError(
            f"flattened segments need {SEGMENT_FIELDS} ints each, got {len(segments)} ints"
        )
    return [
        (segments[i], segments[i + 1], segments[i + 2], segments[i + 3])
        for i in range(0, len(segments), SEGMENT_FIELDS)
    ]


def segment_offsets(segments: Sequence[int], codec: Codec) -> tuple[list[int], int]:
    """Byte offset of each segment in the buffer, and the buffer's total size."""
    offsets, total = [], 0
    for _, rows, _, width in iter_segments(segments):
        offsets.append(total)
        total += rows * codec.row_bytes(width)
    return offsets, total


@functools.lru_cache(maxsize=256)
def reduction_groups(
    segments: tuple[int, ...],
) -> tuple[tuple[tuple[int, int, int, int], tuple[int, ...]], ...]:
    """Group segments by identical output rectangle (see
    :attr:`ExchangeLayout.reduction_groups`)."""
    groups: dict[tuple[int, int, int, int], list[int]] = {}
    for index, seg in enumerate(iter_segments(segments)):
        groups.setdefault(seg, []).append(index)
    check_disjoint(list(groups))
    return tuple((rect, tuple(members)) for rect, members in groups.items())


def check_disjoint(rects: Sequence[tuple[int, int, int, int]], what: str = "segments") -> None:
    """Raise ConfigError if two (row_start, num_rows, col_start, width) rectangles overlap.

    Rectangles that share no row (the unique-row layouts, whose runs follow each other)
    pass in one sort; otherwise a sweep over column starts keeps only column-overlapping
    rectangles active, so the usual layouts (few distinct column blocks) cost near-linear
    time.
    """
    by_rows = sorted(rects)
    if all(a[0] + a[1] <= b[0] for a, b in itertools.pairwise(by_rows)):
        return  # no two rectangles share a row (a unique-row layout): none can overlap
    active: list[tuple[int, int, int, int]] = []
    for rect in sorted(rects, key=lambda r: r[2]):
        r0, n, c0, _ = rect
        active = [a for a in active if a[2] + a[3] > c0]
        for other in active:
            if other[0] < r0 + n and r0 < other[0] + other[1]:
                raise ConfigError(
                    f"{what} rows [{r0}, {r0 + n}) x cols [{c0}, {c0 + rect[3]}) and rows "
                    f"[{other[0]}, {other[0] + other[1]}) x cols [{other[2]}, "
                    f"{other[2] + other[3]}) "
                    "overlap partially; partial results must cover identical blocks or none"
                )
        active.append(rect)
