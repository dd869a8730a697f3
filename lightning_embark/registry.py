"""Registering the project's strategies with Lightning's ``StrategyRegistry``.

Lightning discovers no strategies through entry points, so ``import lightning_embark``
calls :func:`register_strategies`. Each name maps to a small factory that imports its
strategy class on first use, so importing the package does not pull in torchrec.
"""

from __future__ import annotations

from typing import Any

#: Registered names, what each stands for, and the arguments it passes.
STRATEGIES: dict[str, tuple[str, dict[str, Any]]] = {
    "torchrec": ("torchrec DistributedModelParallel with torchrec's planner, fp32 comms", {}),
    "torchrec-fp16": (
        "torchrec DistributedModelParallel with torchrec's planner, FP16 quantized comms",
        {"qcomms": "fp16"},
    ),
    "torchrec-twrw": (
        "torchrec DistributedModelParallel with every table table-row-wise (the EMBark paper's "
        "baseline), fp32 comms",
        {"sharding_types": ("table_row_wise",)},
    ),
    "embark": (
        "EMBark embedding clusters (DP/RB/UB) over a plan; automatic lossless plan unless given",
        {},
    ),
    "embark-towers": (
        "EMBark clusters with DMT towers where the cost model says they pay (identity tower "
        "modules, H, 2H or LH of them, or flat), or the model's own tower collection",
        {"towers": "auto"},
    ),
    "embark-torchrec-plan": (
        "EMBark engine executing torchrec's planner's plan (fp32 RB/DP clusters), to compare "
        "planners",
        {"planner": "torchrec"},
    ),
}


def _torchrec_strategy(**kwargs: Any) -> Any:
    from lightning_embark.strategies import TorchrecStrategy

    return TorchrecStrategy(**kwargs)


def _embark_strategy(**kwargs: Any) -> Any:
    from lightning_embark.strategies import EmbarkStrategy

    return EmbarkStrategy(**kwargs)


_FACTORIES = {
    "torchrec": _torchrec_strategy,
    "torchrec-fp16": _torchrec_strategy,
    "torchrec-twrw": _torchrec_strategy,
    "embark": _embark_strategy,
    "embark-towers": _embark_strategy,
    "embark-torchrec-plan": _embark_strategy,
}


def register_strategies() -> None:
    """Register every strategy name (idempotent: names already present are left alone)."""
    from lightning.pytorch.strategies import StrategyRegistry

    for name, (description, init_params) in STRATEGIES.items():
        if name not in StrategyRegistry:
            StrategyRegistry.register(
                name, _FACTORIES[name], description=description, **init_params
            )
