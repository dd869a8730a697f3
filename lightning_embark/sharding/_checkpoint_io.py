"""Reading an embark checkpoint directory with any strategy, as an unsharded model.

A plain ``Trainer`` (one process, no ``strategy="embark"``) hands ``ckpt_path`` to its
checkpoint IO, whose ``torch.load`` of a directory fails with ``IsADirectoryError``.
:class:`EmbarkCheckpointIO` reads such a directory as the checkpoint of the unsharded
model instead (:func:`~lightning_embark.sharding._export.read_model`), so
``Trainer(plugins=[EmbarkCheckpointIO()]).validate(model, ckpt_path=DIR)`` (and
``test``, ``predict``) evaluate the trained model in one process, and any other path
is read as Lightning reads it.

What it returns is a weights-only checkpoint: the model, loops, callbacks and
hyper-parameters, without the optimizers' states. Those belong to the sharded run (the
sparse optimizer's lives in the tables' owners, and the dense one's parameter groups
are the sharded module's), so resuming *training* takes ``strategy="embark"``, under
any plan and world size. Under ``strategy="embark"`` itself the plugin changes nothing:
the strategy reads and writes its directories itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.fabric.plugins import TorchCheckpointIO
from typing_extensions import override

from lightning_embark.errors import ConfigError
from lightning_embark.sharding._checkpoint import META_FILE, is_sharded_checkpoint
from lightning_embark.sharding._checkpoint_files import read_file
from lightning_embark.sharding._export import read_model

#: What a sharded run's checkpoint holds that no unsharded model can take.
SHARDED_ONLY = ("optimizer_states", "lr_schedulers")


class EmbarkCheckpointIO(TorchCheckpointIO):
    """Lightning's ``torch.save`` / ``torch.load`` checkpoint IO that also reads
    ``strategy="embark"`` checkpoint directories, unsharded (module docstring)."""

    @override
    def load_checkpoint(
        self, path: Any, map_location: Any = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """An embark checkpoint directory as an unsharded weights-only checkpoint; any
        other path as ``TorchCheckpointIO`` reads it.

        Raises:
            ConfigError: ``path`` is a directory but no embark checkpoint.
        """
        directory = Path(path)
        if not directory.is_dir():
            return super().load_checkpoint(path, map_location, weights_only)
        if not is_sharded_checkpoint(directory):
            raise ConfigError(
                f"ckpt_path {str(directory)!r} is a directory but not a checkpoint written by "
                f"strategy='embark' ({META_FILE} and DCP's .metadata are not both in it); pass "
                "a checkpoint file, or the embark checkpoint directory itself"
            )
        load = super().load_checkpoint
        checkpoint = read_file(
            directory / META_FILE, directory, lambda meta: load(meta, map_location, weights_only)
        )
        for key in SHARDED_ONLY:
            checkpoint.pop(key, None)
        checkpoint["state_dict"] = read_model(directory)
        return checkpoint
