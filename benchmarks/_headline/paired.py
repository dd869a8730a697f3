"""The pairs a headline row is measured in: strategies within a repeat, links within a run.

The shared 2-core machine drifts during an hours-long suite, by more than the differences
the suite has to show. Two pairings keep the drift out of what is reported:

* Across strategies: repeat ``r`` runs the strategies in an order rotated by ``r``
  (:func:`rotated`), so that over ``n`` repeats every strategy runs once in every
  position, and every ratio is taken within a repeat, between runs minutes apart, before
  its statistics over repeats (:mod:`~_headline.summary`).
* Across links: each run is the strategy on the shaped link and the same strategy on the
  same hosts unshaped, back to back (:func:`run_pair`). The difference of their median
  steps is the run's *exposed communication*, what the link costs the step: it needs no
  trust in any counter (a strategy's own counter sees only the collectives it labels, and
  misses the time a rank waits on a skewed peer), and it is what a faster link would buy.
  Which of the two goes first alternates (:func:`shaped_first`), so that a first-run
  effect (a cold page cache, a CPU-frequency step) does not always land on the same side.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lightning_embark.harness._runner import exposed_fields


def rotated(items: Sequence[str], repeat: int) -> list[str]:
    """``items`` rotated left by ``repeat``: repeat ``r`` starts with item ``r mod n``, so
    over ``n`` repeats every strategy runs once in every position."""
    if not items:
        return []
    k = repeat % len(items)
    return [*items[k:], *items[:k]]


def shaped_first(repeat: int, index: int) -> bool:
    """Whether strategy ``index`` (its place in the row's labels, not in the rotated
    order) runs its shaped run first in repeat ``repeat``: when ``repeat + index`` is even.

    Each strategy alternates from repeat to repeat (6 repeats: 3 shaped-first, 3
    unshaped-first), and neighbouring strategies start on opposite links. The parity of
    the position in the rotated order, ``(index - repeat) mod n``, would not do for an odd
    number ``n`` of strategies: where it wraps, a strategy starts on the same link twice
    running.
    """
    return (repeat + index) % 2 == 0


def run_pair(run: Callable[..., dict[str, Any]], *, first_shaped: bool) -> dict[str, Any]:
    """One strategy's exposed-communication pair: ``run(unshaped=False)`` on the shaped link
    and ``run(unshaped=True)``, back to back in the order ``first_shaped`` says.

    Returns the shaped run's record with the harness' ``exposed_fields`` added (the
    unshaped run's step, CPU and counter share; ``exposed_ms = T_shaped - T_unshaped`` of
    the two median steps; ``exposed_share = exposed_ms / T_shaped``) and ``pair_order``.
    Where either run found no emulated hosts (a loopback fallback: nothing was shaped),
    the difference is noise and is not reported: ``exposed_ms`` is None and ``exposed_note``
    says why.
    """
    order = (False, True) if first_shaped else (True, False)  # the values of ``unshaped``
    runs = {unshaped: run(unshaped=unshaped) for unshaped in order}
    shaped, unshaped = runs[False], runs[True]
    record = dict(shaped)
    record["pair_order"] = ["shaped" if not u else "unshaped" for u in order]
    if any(r.get("cluster_mode", "netns") != "netns" for r in (shaped, unshaped)):
        record |= {
            "exposed_ms": None,
            "exposed_share": None,
            "exposed_note": "no emulated hosts (loopback): nothing was shaped",
        }
        return record
    return record | exposed_fields(shaped, unshaped)
