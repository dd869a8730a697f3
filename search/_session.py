"""One study session on the ranks: rank 0 leads the study, every other rank follows.

This is the top of the search package's import graph (:mod:`._ranks` holds the two roles'
machinery, :mod:`._study` the study, :mod:`._report` the outcome); every launcher
(``python -m lightning_embark.search``, ``embark-tune`` under ``WORLD_SIZE``) calls
:func:`run_ranks` on every rank.
"""

from __future__ import annotations

import json
import logging

import torch
import torch.distributed as dist

from lightning_embark._leave import leave_process_groups
from lightning_embark.search._config import TuneConfig
from lightning_embark.search._ranks import RESULT_FILE, broadcast, follow
from lightning_embark.search._report import finish
from lightning_embark.search._result import TuneResult
from lightning_embark.search._study import check_same_study, open_study, remeasure, search


def lead(config: TuneConfig) -> TuneResult:
    """Rank 0: the whole study, then the report (see :mod:`._report`)."""
    logging.getLogger("optuna").setLevel(logging.WARNING)
    study = open_study(config)
    check_same_study(study, config)
    search(config, study)
    paired = remeasure(config, study)
    return finish(config, study, paired)


def init_process_group() -> None:
    """The launcher's process group (gloo on CPU ranks), once for the whole study."""
    if not dist.is_initialized():
        dist.init_process_group("gloo")


def run_ranks(config: TuneConfig) -> int:
    """This rank's part of the study (every rank calls it; see the module docstring)."""
    from lightning_embark._logs import quiet_lightning_banners
    from lightning_embark.registry import register_strategies

    torch.set_num_threads(1)
    register_strategies()
    quiet_lightning_banners()
    init_process_group()
    try:
        if dist.get_rank() != 0:
            code = follow(config)
        else:
            result = lead(config)
            broadcast({"op": "stop"})
            (config.run_dir / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=2))
            code = 0
    except BaseException:
        dist.destroy_process_group()  # no barrier: a peer may be gone
        raise
    leave_process_groups()
    return code
