"""One exception root for the project.

Every error the project raises on purpose derives from :class:`EmbarkError`, so
callers can catch the project's failures without catching unrelated bugs. Errors
caused by bad user input also derive from :class:`ValueError`, as Python users
expect.
"""

from __future__ import annotations


class EmbarkError(Exception):
    """Root of every error raised on purpose by lightning-embark."""


class ConfigError(EmbarkError, ValueError):
    """A spec, topology, plan or option given by the user is invalid."""


class PlanInfeasibleError(ConfigError):
    """The tables do not fit the cluster's memory under the layouts tried.

    Unlike other configuration errors the inputs are well formed; what is short is
    memory. Tools that search plans (``embark-tune``) record such a candidate as
    infeasible instead of failing.

    Attributes:
        table: The table that did not fit.
        shortfall_bytes: How many bytes were missing where it was to be placed.
    """

    def __init__(self, message: str, *, table: str, shortfall_bytes: float) -> None:
        super().__init__(message)
        self.table = table
        self.shortfall_bytes = float(shortfall_bytes)


class CheckpointError(ConfigError):
    """A checkpoint directory is incomplete, truncated or corrupt; the message names the file.

    A ``ConfigError`` because the checkpoint is the user's input (``ckpt_path``), and
    like one it is raised on every rank before training resumes.
    """


class DataFormatError(EmbarkError, ValueError):
    """An input data file is malformed; the message names file and line."""


class EmulationError(EmbarkError, RuntimeError):
    """The emulated multi-host network could not be created, launched or cleaned up."""


class PeerError(EmbarkError, RuntimeError):
    """A collective failed because a peer rank died, dropped its connection or stalled.

    Attributes:
        gone: The ranks found gone when it was raised (their liveness sockets refused a
            connection); empty when none was (a stalled peer) or none could be asked.
    """

    def __init__(self, message: str, *, gone: tuple[int, ...] = ()) -> None:
        super().__init__(message)
        self.gone = tuple(gone)
