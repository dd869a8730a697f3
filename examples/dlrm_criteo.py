"""Recipe: torchrec DLRM / DLRM-DCNv2 on a Criteo file: ``examples/dlrm_ctr.py`` under its
Criteo defaults, by its older name.

::

    python examples/dlrm_criteo.py fit --data.path ../shared/data/criteo-autorec-train-10k.txt \\
        --trainer.strategy embark --trainer.devices 2
    python examples/dlrm_criteo.py predict --data.path FILE --predictions predictions.csv

Every option of ``dlrm_ctr.py`` works here (``--data.delimiter`` and the other layout
options too); the only difference is the name it prints (``[dlrm_criteo] ...``). See
``examples/dlrm_ctr.py`` for the options, ``--report_dir`` and ``predict``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from lightning_embark.testing import load_module

_ctr = load_module(Path(__file__).resolve().with_name("dlrm_ctr.py"), "dlrm_ctr")

CRITEO_DEFAULTS = _ctr.CRITEO_DEFAULTS
CTRDLRM = _ctr.CTRDLRM
RECIPE_BATCH_SIZE = _ctr.RECIPE_BATCH_SIZE
RECIPE_NUM_EMBEDDINGS = _ctr.RECIPE_NUM_EMBEDDINGS
TRAINER_DEFAULTS = _ctr.TRAINER_DEFAULTS


def main(args: list[str] | None = None, *, run: bool = True) -> Any:
    """Build (and with ``run``, execute) ``dlrm_ctr``'s ``RecipeCLI``; ``args`` replaces
    ``sys.argv[1:]``."""
    return _ctr.main(args, run=run, name="dlrm_criteo")


if __name__ == "__main__":
    main()
    sys.exit(0)
