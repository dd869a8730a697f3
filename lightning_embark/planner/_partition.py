"""The tower partitioner (DMT's TP): which tables form towers.

A tower module (``projection``, ``dcn``) sees only its own tower's features before
its output is compressed; features in different towers meet only in the global
interaction, after compression. So a good partition keeps the feature pairs that
interact most inside one tower. DMT's partitioner is not public; this one is ours:

* **Objective.** Given a symmetric, non-negative feature affinity ``A`` (measured
  from a warm-up run of the flat model, :mod:`._affinity`), maximise the affinity
  kept inside towers, ``sum_{i<j, t(i)=t(j)} A_ij``.
* **Constraints.** Each tower's estimated cost ``sum_i c_i`` (``c_i``: the table
  alone on a host, :func:`~._towers.table_costs`) is at most
  ``max(balance * mean, max_i c_i)`` (``mean = sum_i c_i / count``; a table costlier
  than the cap cannot be split across towers), its weights fit one host's memory, and
  no tower is empty.
* **Search.** Restart 0 starts from the longest-cost-first balanced partition (LPT);
  restarts ``1..R-1`` from seeded random orders placed greedily by affinity. Each is
  then improved by steepest-ascent local search over single moves and pairwise swaps
  (Kernighan-Lin style) that keep the constraints; the best objective wins (ties: the
  lower restart). With zero affinity no move gains, so the result is exactly the LPT
  partition: the statistics-only fallback is the same code path. Deterministic per
  seed.

The forms a user gives towers in (a count, ``"auto"``, a ``towers.json``) are read by
:func:`~._tower_choice.resolve_towers`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from lightning_embark.errors import ConfigError
from lightning_embark.plan import Compression, TowerModule, TowerRequest
from lightning_embark.planner._cost import CostModel
from lightning_embark.planner._towers import table_costs

#: Default cap of a tower's cost over the mean tower cost.
DEFAULT_BALANCE = 1.25
#: Default number of restarts of the local search.
DEFAULT_RESTARTS = 8


@dataclasses.dataclass(frozen=True, kw_only=True)
class FeatureAffinity:
    """How strongly pairs of features interact in a model.

    Attributes:
        features: Feature (= table) names, in the matrix's order.
        matrix: ``[F, F]``, symmetric, non-negative, zero diagonal.
        source: What it was measured from, for reports.
    """

    features: tuple[str, ...]
    matrix: np.ndarray
    source: str = ""

    def __post_init__(self) -> None:
        m = np.asarray(self.matrix, dtype=np.float64)
        n = len(self.features)
        if m.shape != (n, n):
            raise ConfigError(
                f"affinity ({self.source or 'given'}): matrix of shape {m.shape} for {n} features"
            )
        if len(set(self.features)) != n:
            raise ConfigError(f"affinity ({self.source or 'given'}): repeated feature names")
        if not np.all(np.isfinite(m)) or (m < 0).any():
            raise ConfigError(
                f"affinity ({self.source or 'given'}): entries must be finite and non-negative"
            )
        if not np.allclose(m, m.T, rtol=1e-9, atol=0.0):
            raise ConfigError(f"affinity ({self.source or 'given'}): matrix is not symmetric")
        m = 0.5 * (m + m.T)
        np.fill_diagonal(m, 0.0)
        object.__setattr__(self, "matrix", m)

    def over(self, names: Sequence[str]) -> np.ndarray:
        """The affinity among ``names`` (zero for features it does not know)."""
        index = {f: i for i, f in enumerate(self.features)}
        pos = [index.get(n, -1) for n in names]
        out = np.zeros((len(names), len(names)))
        known = [k for k, p in enumerate(pos) if p >= 0]
        rows = [pos[k] for k in known]
        out[np.ix_(known, known)] = self.matrix[np.ix_(rows, rows)]
        return out

    def save(self, path: str | Path) -> None:
        """Write as JSON (features, matrix rows, source)."""
        doc = {"features": list(self.features), "matrix": self.matrix.tolist()}
        Path(path).write_text(json.dumps({**doc, "source": self.source}) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> FeatureAffinity:
        """Read what :meth:`save` wrote.

        Raises:
            ConfigError: the file is missing or not an affinity document.
        """
        try:
            doc = json.loads(Path(path).read_text())
            return cls(
                features=tuple(doc["features"]),
                matrix=np.asarray(doc["matrix"], dtype=np.float64),
                source=str(doc.get("source", path)),
            )
        except (OSError, ValueError, KeyError, TypeError) as error:
            if isinstance(error, ConfigError):
                raise
            raise ConfigError(f"affinity file {str(path)!r}: {error}") from None


def kept_affinity(affinity: np.ndarray, groups: Sequence[Sequence[int]]) -> float:
    """``sum_{i<j in one group} A_ij`` over ``sum_{i<j} A_ij``: the share of the
    interaction a partition keeps inside towers (1 for zero affinity)."""
    total = float(np.triu(affinity, 1).sum())
    if total <= 0.0:
        return 1.0
    kept = sum(float(np.triu(affinity[np.ix_(g, g)], 1).sum()) for g in groups)
    return kept / total


def partition_by_affinity(
    affinity: np.ndarray,
    costs: np.ndarray,
    count: int,
    *,
    balance: float = DEFAULT_BALANCE,
    sizes: np.ndarray | None = None,
    capacity: float | None = None,
    seed: int = 0,
    restarts: int = DEFAULT_RESTARTS,
) -> list[list[int]]:
    """Groups of item indices maximising kept affinity under the balance cap (see the
    module docstring).

    Args:
        affinity: ``[n, n]`` symmetric, non-negative.
        costs: ``[n]`` estimated cost per item.
        count: Towers wanted (fewer when there are fewer items).
        balance: Cap of a tower's cost over the mean, at least 1.
        sizes: ``[n]`` bytes per item (with ``capacity``).
        capacity: Bytes one tower may hold (None: unbounded).
        seed: Seeds the random restarts.
        restarts: Starting points (the first is LPT).

    Returns:
        Non-empty groups, each sorted, ordered by their first item.

    Raises:
        ConfigError: ``count`` or ``balance`` or ``restarts`` out of range.
    """
    n = len(costs)
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"tower count must be a positive integer, got {count!r}")
    if not balance >= 1.0:
        raise ConfigError(f"balance cap must be at least 1 (the mean), got {balance}")
    if restarts < 1:
        raise ConfigError(f"restarts must be at least 1, got {restarts}")
    if n == 0:
        return []
    a = np.asarray(affinity, dtype=np.float64)
    assert a.shape == (n, n)
    c = np.asarray(costs, dtype=np.float64)
    k = min(count, n)
    bound = max(balance * c.sum() / k, float(c.max()))
    mem = np.zeros(n) if sizes is None else np.asarray(sizes, dtype=np.float64)
    cap = np.inf if capacity is None else float(capacity)
    search = _Search(a, c, mem, bound=bound, capacity=cap, towers=k)
    best, best_score = None, -np.inf
    rng = np.random.default_rng(seed)
    # LPT may exceed a tight cap (by up to one table): its own maxima are then the
    # limits a restart must keep, so the result is never less balanced than LPT.
    lpt = search.lpt()
    limit_cost, limit_bytes = search.maxima(lpt)
    limit_cost, limit_bytes = max(limit_cost, bound), max(limit_bytes, cap)
    for restart in range(restarts):
        start = lpt if restart == 0 else search.greedy(rng.permutation(n))
        assign = search.improve(start)
        most_cost, most_bytes = search.maxima(assign)
        if most_cost > limit_cost * (1 + 1e-12) or most_bytes > limit_bytes * (1 + 1e-12):
            continue
        score = search.score(assign)
        if best is None or score > best_score * (1 + 1e-12) + 1e-300:
            best, best_score = assign, score
    assert best is not None
    groups = [sorted(np.flatnonzero(best == t).tolist()) for t in range(k)]
    return sorted((g for g in groups if g), key=lambda g: g[0])


@dataclasses.dataclass
class _Search:
    """One partition search's data: affinity, costs, bytes, and the caps."""

    a: np.ndarray
    c: np.ndarray
    mem: np.ndarray
    bound: float
    capacity: float
    towers: int

    def score(self, assign: np.ndarray) -> float:
        same = assign[:, None] == assign[None, :]
        return float(0.5 * (self.a * same).sum())

    def maxima(self, assign: np.ndarray) -> tuple[float, float]:
        """The costliest and the fullest tower of ``assign``."""
        cost = np.bincount(assign, weights=self.c, minlength=self.towers)
        held = np.bincount(assign, weights=self.mem, minlength=self.towers)
        return float(cost.max()), float(held.max())

    def lpt(self) -> np.ndarray:
        """Longest cost first onto the cheapest tower (ties: the lower index)."""
        assign = np.empty(len(self.c), dtype=np.int64)
        load = np.zeros(self.towers)
        for i in sorted(range(len(self.c)), key=lambda i: (-self.c[i], i)):
            t = int(np.argmin(load))
            assign[i] = t
            load[t] += self.c[i]
        return assign

    def greedy(self, order: np.ndarray) -> np.ndarray:
        """Items in ``order``: the first ``towers`` seed the towers, each later one goes
        to the feasible tower it has most affinity with (else the cheapest)."""
        assign = np.full(len(self.c), -1, dtype=np.int64)
        load, held = np.zeros(self.towers), np.zeros(self.towers)
        for step, i in enumerate(order):
            if step < self.towers:
                t = step
            else:
                pull = np.array(
                    [self.a[i, assign == t].sum() for t in range(self.towers)], dtype=np.float64
                )
                ok = (load + self.c[i] <= self.bound) & (held + self.mem[i] <= self.capacity)
                t = int(np.argmax(np.where(ok, pull, -np.inf))) if ok.any() else -1
                if t < 0:
                    t = int(np.argmin(load))
            assign[i] = t
            load[t] += self.c[i]
            held[t] += self.mem[i]
        return assign

    def improve(self, assign: np.ndarray) -> np.ndarray:
        """Steepest-ascent moves and swaps that keep every constraint.

        ``S[i, t] = sum_{j in t} A_ij``; moving ``i`` from ``s`` to ``t`` gains
        ``S[i,t] - S[i,s]``; swapping ``i in s`` with ``j in t`` gains
        ``S[i,t] - S[i,s] + S[j,s] - S[j,t] - 2 A_ij``.
        """
        assign = assign.copy()
        n, k = len(self.c), self.towers
        onehot = np.zeros((n, k))
        onehot[np.arange(n), assign] = 1.0
        s = self.a @ onehot
        load, held, count = self.c @ onehot, self.mem @ onehot, onehot.sum(axis=0)
        tol = 1e-12 * max(float(self.a.sum()), 1e-300)
        rows = np.arange(n)
        for _ in range(50 * n + 50):
            own = s[rows, assign]
            move = s - own[:, None]
            ok = (load[None, :] + self.c[:, None] <= self.bound) & (
                held[None, :] + self.mem[:, None] <= self.capacity
            )
            ok &= assign[:, None] != np.arange(k)[None, :]
            ok &= (count[assign] > 1)[:, None]
            move = np.where(ok, move, -np.inf)
            mi = int(np.argmax(move))
            move_gain = move.flat[mi]
            st = s[:, assign]  # S[i, t(j)]
            swap = st - own[:, None] + st.T - own[None, :] - 2.0 * self.a
            dc = self.c[None, :] - self.c[:, None]  # c_j - c_i
            dm = self.mem[None, :] - self.mem[:, None]
            fits = (load[assign][:, None] + dc <= self.bound) & (
                load[assign][None, :] - dc <= self.bound
            )
            fits &= (held[assign][:, None] + dm <= self.capacity) & (
                held[assign][None, :] - dm <= self.capacity
            )
            fits &= assign[:, None] < assign[None, :]
            swap = np.where(fits, swap, -np.inf)
            si = int(np.argmax(swap))
            swap_gain = swap.flat[si]
            if max(move_gain, swap_gain) <= tol:
                break
            if move_gain >= swap_gain:
                i, t = divmod(mi, k)
                changes = [(i, t)]
            else:
                i, j = divmod(si, n)
                changes = [(i, int(assign[j])), (j, int(assign[i]))]
            for item, target in changes:
                source = int(assign[item])
                s[:, source] -= self.a[:, item]
                s[:, target] += self.a[:, item]
                load[source] -= self.c[item]
                load[target] += self.c[item]
                held[source] -= self.mem[item]
                held[target] += self.mem[item]
                count[source] -= 1
                count[target] += 1
                assign[item] = target
        return assign


def partition_tables(
    model: CostModel,
    count: int,
    *,
    affinity: FeatureAffinity | None = None,
    balance: float = DEFAULT_BALANCE,
    seed: int = 0,
    module: TowerModule = TowerModule.IDENTITY,
    output_ratio: float | None = None,
    compression: Compression = Compression.FP32,
) -> list[TowerRequest]:
    """``count`` towers over ``model``'s tables (see the module docstring).

    Without ``affinity`` the partition is statistics-only: balanced estimated costs
    (LPT, within ``4/3`` of the optimal maximum). Tables whose weights alone exceed a
    host's memory stay flat.

    Raises:
        ConfigError: ``count`` is not positive, ``balance`` below 1.
    """
    if not isinstance(count, int) or count < 1:
        raise ConfigError(f"tower count must be a positive integer, got {count!r}")
    calib = model.calib
    host_memory = (
        None if calib.memory_per_rank is None else calib.memory_per_rank * model.ranks_per_host
    )
    weights = {
        t.name: t.num_embeddings * t.embedding_dim * calib.weight_bytes for t in model.spec.tables
    }
    fits = [n for n, w in weights.items() if host_memory is None or w <= host_memory]
    costs = table_costs(model, fits)
    matrix = np.zeros((len(fits), len(fits))) if affinity is None else affinity.over(fits)
    groups = partition_by_affinity(
        matrix,
        np.array([costs[n] for n in fits]),
        count,
        balance=balance,
        sizes=np.array([weights[n] for n in fits]),
        capacity=host_memory,
        seed=seed,
    )
    ratio = None if module is TowerModule.IDENTITY else output_ratio
    return [
        TowerRequest(
            name=f"tower{i}",
            tables=tuple(fits[j] for j in group),
            module=module,
            output_ratio=ratio,
            forward_compression=compression,
            backward_compression=compression,
        )
        for i, group in enumerate(groups)
    ]
