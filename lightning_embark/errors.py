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


class DataFormatError(EmbarkError, ValueError):
    """An input data file is malformed; the message names file and line."""


class ClusterError(EmbarkError, RuntimeError):
    """The emulated cluster could not be created, launched or cleaned up."""


class PeerError(EmbarkError, RuntimeError):
    """A collective failed because a peer rank died, dropped its connection or stalled."""
