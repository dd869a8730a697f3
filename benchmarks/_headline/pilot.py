"""The link rate of a headline row, set on the reference by a pilot.

The regime is defined on what a torchrec user runs: per comm-bound model, the link rate
is the one at which ``torchrec-fp16`` (pipelined) has 30-50% of its step *exposed* in
communication (40% aimed at), measured as the suite measures every run: its step on the
shaped link minus its step on the same hosts unshaped (:mod:`~_headline.paired`).

The pilot runs the reference once unshaped (``T_u``), then shaped at the start rate; with
its exposed time ``E = T_s - T_u`` it moves the rate and runs again, up to
:data:`MAX_SHAPED_RUNS` shaped runs, until the measured exposed share ``E / T_s`` is inside
the band. The next rate is :func:`bracketed_rate` once runs lie on both sides of the target
(interpolated between the nearest two), else :func:`pilot_rate`'s ``1 / rate`` model: a
pipelined reference hides its exchange until the link saturates, so its exposed time
grows faster than ``1 / rate`` below that point, and the model alone overshoots (MLPerf,
2026-12-07: 6% at 800 Mbit/s, 81% at 70, 16% at 460). A shaped step at or below ``T_u``
cannot be (a link adds time), so the first such run measures ``T_u`` again, once, and goes
on with the new one. Whether it landed is kept in the record and the report.
``--rate-mbit`` skips the pilot; the compute-bound row keeps the emulation's default rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from .progress import log
from .runs import RunSettings, run_one
from .workloads import Workload

#: The emulation's accepted link rates (``EmulationConfig.rate_mbit``: 0.001..1,000,000).
RATE_MIN_MBIT = 0.001
RATE_MAX_MBIT = 1_000_000.0
#: The default link rate of the emulation (``lightning_embark.emulation.DEFAULT_RATE_MBIT``).
DEFAULT_RATE_MBIT = 800.0
#: The exposed share of the reference's step the pilot aims at (the middle of the band).
TARGET_SHARE = 0.40
#: The band the reference's exposed share must land in.
SHARE_BAND = (0.30, 0.50)
#: The reference the regime is set on.
REFERENCE = "torchrec-fp16"
#: Shaped pilot runs at most (the unshaped one aside).
MAX_SHAPED_RUNS = 5
#: The rate's divisor when a pilot run shows no exposed time (``E <= 0``): no scaling can
#: start from zero, and a quarter of the rate takes each byte 4x as long on the link.
NO_EXPOSURE_DIVISOR = 4.0


def pilot_rate(
    rate_mbit: float,
    exposed_ms: float,
    unshaped_ms: float,
    *,
    target: float = TARGET_SHARE,
    low: float = RATE_MIN_MBIT,
    high: float = RATE_MAX_MBIT,
) -> float:
    """The link rate at which the reference should have ``target`` of its step exposed.

    Model: the unshaped step ``T_u`` does not depend on the rate, and the exposed time
    ``E = T_s - T_u`` scales as ``1 / rate``. The exposed share ``E / (T_u + E)`` is
    ``target`` when ``E* = target / (1 - target) * T_u``, at::

        r* = r * E / E*

    clamped to ``[low, high]`` (the emulation's range). ``E <= 0`` (the link cost nothing
    measurable at ``r``) gives ``r / NO_EXPOSURE_DIVISOR``: no rate scales a zero exposure.

    Raises:
        ValueError: a ``target`` outside ``(0, 1)`` or an unshaped step that is not positive.
    """
    if not 0 < target < 1:
        raise ValueError(f"target share must be within (0, 1), got {target}")
    if not unshaped_ms > 0:
        raise ValueError(f"the unshaped step must be positive, got {unshaped_ms} ms")
    if exposed_ms <= 0:
        chosen = rate_mbit / NO_EXPOSURE_DIVISOR
    else:
        chosen = rate_mbit * exposed_ms / (target / (1 - target) * unshaped_ms)
    return min(high, max(low, chosen))


def bracketed_rate(runs: list[dict[str, Any]], target: float = TARGET_SHARE) -> float | None:
    """The rate between the two runs nearest ``target`` on either side, or None when every
    run lies on one side.

    The exposed share falls as the rate rises; between the run just below the target
    (``s_lo`` at ``r_lo``, the faster link) and the one just above (``s_hi`` at ``r_hi``)
    the share is taken as linear in ``log rate``::

        log r* = log r_lo + (target - s_lo) / (s_hi - s_lo) * (log r_hi - log r_lo)

    which needs no model of how much the reference hides.
    """
    below = [r for r in runs if r["exposed_share"] < target]
    above = [r for r in runs if r["exposed_share"] > target]
    if not below or not above:
        return None
    lo = max(below, key=lambda r: r["exposed_share"])
    hi = min(above, key=lambda r: r["exposed_share"])
    fraction = (target - lo["exposed_share"]) / (hi["exposed_share"] - lo["exposed_share"])
    return math.exp(
        math.log(lo["rate_mbit"])
        + fraction * (math.log(hi["rate_mbit"]) - math.log(lo["rate_mbit"]))
    )


def choose_rate(
    workload: Workload,
    model: str,
    *,
    override: float | None,
    start_rate: float,
    pilot_steps: int,
    pilot_warmup: int,
    target: float,
    settings: RunSettings,
    runner: Callable[..., dict[str, Any]] = run_one,
) -> tuple[float | None, str, dict[str, Any] | None]:
    """The workload's link rate, where it came from, and the pilot's record (if one ran).

    ``--rate-mbit`` overrides; the compute-bound row keeps the default rate; a comm-bound
    row pilots :data:`REFERENCE` (module docstring). On loopback there is no rate to choose.
    The record: the unshaped step (and ``remeasured``: its first and second figures, where a
    shaped step came out at or below it), every shaped run's rate, step, exposed ms and share,
    ``landed`` (the last shaped run's share inside ``band``), and the rate chosen: the
    landed run's, else the next rate the pilot would have tried (:func:`bracketed_rate` or
    :func:`pilot_rate`; not measured: the main runs' exposed share of the reference, in the
    report, says where it fell).
    """
    if settings.loopback:
        return None, "loopback: no shaped link", None
    if override is not None:
        return override, "--rate-mbit", None
    if not workload.pilot:
        return DEFAULT_RATE_MBIT, "default (compute-bound row)", None
    low, high = SHARE_BAND

    def run(rate: float, unshaped: bool) -> dict[str, Any]:
        link = "unshaped" if unshaped else f"{rate:.4g} Mbit/s"
        log(f"{workload.key}: pilot {REFERENCE} ({link})")
        return runner(
            workload,
            model,
            REFERENCE,
            rate_mbit=rate,
            settings=settings,
            steps=pilot_steps,
            warmup=pilot_warmup,
            unshaped=unshaped,
        )

    base = run(start_rate, True)
    unshaped_ms = base["step_time_ms"]["median"]
    pilot: dict[str, Any] = {
        "reference": REFERENCE,
        "start_rate_mbit": start_rate,
        "target": target,
        "band": [low, high],
        "steps": pilot_steps,
        "warmup": pilot_warmup,
        "unshaped_step_ms": unshaped_ms,
        "runs": [],
        "landed": False,
    }
    rate = start_rate
    for _ in range(MAX_SHAPED_RUNS):
        shaped = run(rate, False)
        if shaped["rate_mbit"] is None or shaped.get("cluster_mode", "netns") != "netns":
            log(f"{workload.key}: the pilot ran on loopback (no namespaces); no rate to choose")
            pilot["rate_mbit"] = None
            return None, "loopback fallback: no shaped link", pilot
        step = shaped["step_time_ms"]["median"]
        if step <= unshaped_ms and not pilot.get("remeasured"):
            # A link cannot make a step faster: the unshaped figure is off (the suite's
            # first run pays cold caches). Measure it again, once, next to the shaped run.
            log(f"{workload.key}: shaped {step:.1f} <= unshaped {unshaped_ms:.1f} ms; again")
            unshaped_ms = run(start_rate, True)["step_time_ms"]["median"]
            pilot["remeasured"] = {"first_ms": pilot["unshaped_step_ms"], "then_ms": unshaped_ms}
            pilot["unshaped_step_ms"] = unshaped_ms
        exposed = step - unshaped_ms
        share = exposed / step
        pilot["runs"].append(
            {"rate_mbit": rate, "step_ms": step, "exposed_ms": exposed, "exposed_share": share}
        )
        log(f"{workload.key}: pilot {REFERENCE} exposed {share:.0%} at {rate:.4g} Mbit/s")
        if low <= share <= high:
            pilot["landed"] = True
            break
        rate = bracketed_rate(pilot["runs"], target) or pilot_rate(
            rate, exposed, unshaped_ms, target=target
        )
    pilot["rate_mbit"] = rate
    last = pilot["runs"][-1]
    tries = len(pilot["runs"])
    if pilot["landed"]:
        source = f"pilot: {REFERENCE} exposed {last['exposed_share']:.0%} (landed, {tries} run(s))"
    else:
        source = (
            f"pilot: {REFERENCE} exposed {last['exposed_share']:.0%} at "
            f"{last['rate_mbit']:.4g} (not landed in {tries} runs; next rate, unmeasured)"
        )
        log(f"{workload.key}: the pilot did not land in {low:.0%}-{high:.0%}; {source}")
    return rate, source, pilot
