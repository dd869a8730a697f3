"""Least-loaded placement of a table's blocks under a per-rank memory cap.

Kept apart from the planner so that the one place that can run out of memory
produces the one infeasibility error, naming the table and the shortfall.
"""

from __future__ import annotations

import numpy as np

from lightning_embark.errors import PlanInfeasibleError

GIB = 2**30


def size_text(num_bytes: float) -> str:
    """Bytes in the largest binary unit that keeps a digit before the point."""
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(num_bytes) >= scale:
            return f"{num_bytes / scale:.2f} {unit}"
    return f"{num_bytes:.0f} B"


class Placer:
    """Tracks per-rank load (seconds) and free memory (bytes) while blocks are placed.

    Args:
        num_hosts: Hosts.
        ranks_per_host: Ranks per host.
        capacity: Bytes each rank has for blocks.
    """

    def __init__(self, *, num_hosts: int, ranks_per_host: int, capacity: float) -> None:
        self.hosts, self.local = num_hosts, ranks_per_host
        self.world = num_hosts * ranks_per_host
        self.load = np.zeros(self.world)
        self.free = np.full(self.world, float(capacity))

    def place(
        self, table: str, *, k: int, c: int, load: float, size: float, by_host: bool
    ) -> list[int]:
        """Ranks for blocks ``i * c + j`` of one table, each block costing ``load`` and ``size``.

        With ``by_host`` the ``k`` row shards of each column shard go to the least-loaded
        host (or ``k / L`` hosts), so their partial sums can be reduced inside it.

        Raises:
            PlanInfeasibleError: no rank has room for a block; names the table and the shortfall.
        """
        ranks = [-1] * (k * c)
        used = np.zeros(self.world, dtype=bool)
        for j in range(c):
            if by_host and k > 1:
                chosen = self._host_group(table, k, load, size, used)
            else:
                chosen = [self._one(table, k * c, load, size, used) for _ in range(k)]
            for i, rank in enumerate(chosen):
                ranks[i * c + j] = rank
        return ranks

    def _take(self, rank: int, load: float, size: float, used: np.ndarray) -> int:
        self.load[rank] += load
        self.free[rank] -= size
        used[rank] = True
        return rank

    def _one(self, table: str, blocks: int, load: float, size: float, used: np.ndarray) -> int:
        fits = self.free >= size
        if not fits.any():
            self._fail(table, blocks, size)
        score = np.where(fits, self.load + np.where(used, np.inf, 0.0), np.inf)
        if not np.isfinite(score).any():  # every fitting rank already holds a block of this table
            score = np.where(fits, self.load, np.inf)
        return self._take(int(np.argmin(score)), load, size, used)

    def _host_group(
        self, table: str, k: int, load: float, size: float, used: np.ndarray
    ) -> list[int]:
        local = self.local
        fits = (self.free >= size) & ~used
        if k <= local:
            by_host = fits.reshape(self.hosts, local)
            loads = np.where(by_host, self.load.reshape(self.hosts, local), np.inf)
            order = np.argsort(loads, axis=1, kind="stable")[:, :k]
            best = np.take_along_axis(loads, order, axis=1)
            host_cost = best.sum(axis=1)
            host = int(np.argmin(host_cost))
            if not np.isfinite(host_cost[host]):
                return [self._one(table, k, load, size, used) for _ in range(k)]
            return [self._take(host * local + int(r), load, size, used) for r in order[host]]
        need = -(-k // local)
        full = fits.reshape(self.hosts, local).all(axis=1)
        host_load = np.where(full, self.load.reshape(self.hosts, local).sum(axis=1), np.inf)
        hosts = np.argsort(host_load, kind="stable")[:need]
        if len(hosts) < need or not np.isfinite(host_load[hosts]).all():
            return [self._one(table, k, load, size, used) for _ in range(k)]
        ranks = [int(h) * local + r for h in sorted(hosts.tolist()) for r in range(local)][:k]
        return [self._take(r, load, size, used) for r in ranks]

    def _fail(self, table: str, blocks: int, size: float) -> None:
        largest = float(self.free.max())
        total_free = float(np.clip(self.free, 0, None).sum())
        raise PlanInfeasibleError(
            f"table {table!r} does not fit: a block of its {blocks}-block layout needs "
            f"{size_text(size)} but the emptiest rank has {size_text(largest)} left (short by "
            f"{size_text(size - largest)}; {size_text(total_free)} free over all ranks); add "
            "ranks or memory per rank, or cap rows with --max-rows",
            table=table,
            shortfall_bytes=size - largest,
        )
