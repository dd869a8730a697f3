"""``python -m lightning_embark.search CONFIG.json``: one rank of a study (what ``embark-tune``
launches under torchrun on every emulated host; see :mod:`._session`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lightning_embark.search._config import TuneConfig
from lightning_embark.search._session import run_ranks


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m lightning_embark.search CONFIG.json")
    config = TuneConfig.from_dict(json.loads(Path(args[0]).read_text()))
    return run_ranks(config)


if __name__ == "__main__":
    sys.exit(main())
