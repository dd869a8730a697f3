"""Reading a checkpoint directory's files so that a damaged one is named, not guessed at.

DCP and ``torch.load`` report a truncated file as ``pickle data was truncated``,
``PytorchStreamReader failed reading zip archive`` or a ``CheckpointException`` with a
rank's traceback, none of which names the file or the checkpoint. Here every read is
wrapped, and the data files are checked against the sizes ``.metadata`` records before
DCP reads them, so an interrupted save or copy is reported as exactly that: which file,
how many bytes it has and needs, in which checkpoint directory.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import Metadata

from lightning_embark.errors import CheckpointError, EmbarkError

T = TypeVar("T")
METADATA_FILE = ".metadata"


def _damaged(file: Path, directory: Path, error: BaseException) -> CheckpointError:
    reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return CheckpointError(
        f"checkpoint file {str(file)!r} cannot be read: it is truncated or corrupt "
        f"({type(error).__name__}: {reason}); checkpoint directory {str(directory)!r}. The "
        "save or a copy of it was interrupted: copy the directory again, or resume from "
        "another checkpoint"
    )


def read_metadata(directory: Path) -> Metadata:
    """DCP's ``.metadata`` of ``directory``.

    Raises:
        CheckpointError: the file cannot be unpickled (truncated or corrupt).
    """
    try:
        return dcp.FileSystemReader(directory).read_metadata()
    except EmbarkError:
        raise
    except Exception as error:
        raise _damaged(directory / METADATA_FILE, directory, error) from error


def check_data_files(directory: Path, metadata: Metadata) -> None:
    """Every data file ``metadata`` points into exists and is long enough.

    Raises:
        CheckpointError: a file is missing, or shorter than the last byte recorded
            for it (truncated), named with both sizes.
    """
    needed: dict[str, int] = {}
    storage: dict[Any, Any] = metadata.storage_data or {}
    for info in storage.values():
        name = str(info.relative_path)
        needed[name] = max(needed.get(name, 0), int(info.offset) + int(info.length))
    for name, size in sorted(needed.items()):
        file = directory / name
        if not file.is_file():
            raise CheckpointError(
                f"checkpoint file {str(file)!r} is missing: {METADATA_FILE} records {size} bytes "
                f"of tensors in it; checkpoint directory {str(directory)!r} is incomplete (copy "
                "it again, or resume from another checkpoint)"
            )
        actual = file.stat().st_size
        if actual < size:
            raise CheckpointError(
                f"checkpoint file {str(file)!r} is truncated: it has {actual} bytes but "
                f"{METADATA_FILE} records tensors up to byte {size}; checkpoint directory "
                f"{str(directory)!r}. The save or a copy of it was interrupted: copy the "
                "directory again, or resume from another checkpoint"
            )


def load_tensors(directory: Path, load: Callable[[], T]) -> T:
    """Run ``load`` (a ``dcp.load`` of ``directory``), naming the directory if it fails.

    The files were checked by :func:`check_data_files`; what fails here is damage
    within a file (corrupt bytes), which DCP reports per rank without a file name.
    """
    try:
        return load()
    except EmbarkError:
        raise
    except (CheckpointException, Exception) as error:
        reason = str(error).strip().splitlines()
        raise CheckpointError(
            f"the tensors of checkpoint directory {str(directory)!r} cannot be read: its data "
            f"files (*.distcp) are corrupt ({type(error).__name__}: "
            f"{reason[0] if reason else ''}); copy the directory again, or resume from "
            "another checkpoint"
        ) from error


def read_file(file: Path, directory: Path, read: Callable[[Path], T]) -> T:
    """``read(file)`` (e.g. ``torch.load``), naming ``file`` and ``directory`` if it fails.

    Raises:
        CheckpointError: the file is missing, truncated or corrupt.
    """
    if not file.is_file():
        raise CheckpointError(
            f"checkpoint file {str(file)!r} is missing; checkpoint directory {str(directory)!r} "
            "is incomplete (copy it again, or resume from another checkpoint)"
        )
    try:
        return read(file)
    except EmbarkError:
        raise
    except Exception as error:
        raise _damaged(file, directory, error) from error
