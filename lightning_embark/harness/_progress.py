"""A bench a user can watch: rank 0's progress bar, and the bench redrawing it in place.

The ranks run as torchrun children of the emulated hosts' launchers, whose output reaches
the bench through a pipe, line by line, each line prefixed with its host
(``lightning_embark.emulation``). A tqdm bar redrawn in place with carriage returns would
reach the user only when its run ends, as one line. So rank 0's bar
(:class:`StepProgress`) writes each redraw as a line of its own, tagged
:data:`PROGRESS_TAG`; in a log or a captured stream these are plain lines, one per step at
most once a second, and on a terminal the bench redraws them over each other
(:class:`InPlaceProgress`).
"""

from __future__ import annotations

import sys
from typing import IO, Any

import lightning.pytorch as pl
from tqdm import tqdm

#: Starts every progress line rank 0 prints (after the launcher's ``[host 0]``).
PROGRESS_TAG = "[progress]"


class _ProgressLines:
    """A file for tqdm that turns each redraw into one tagged line."""

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        line = text.replace("\r", "").strip()
        if line:
            self._stream.write(f"{PROGRESS_TAG} {line}\n")
        return len(text)

    def flush(self) -> None:
        self._stream.flush()


class StepProgress(pl.Callback):
    """A progress bar over a run's training steps, warm-up ones marked as such.

    Args:
        title: What runs, e.g. ``embark (2/3)``.
        total: Warm-up and measured steps.
        warmup: The first steps, not measured.
        stream: Where the lines go (default: stdout, which the launcher relays).
        mininterval: Seconds between two lines at least (the last step always shows).
    """

    def __init__(
        self,
        *,
        title: str,
        total: int,
        warmup: int,
        stream: IO[str] | None = None,
        mininterval: float = 1.0,
    ) -> None:
        self.title = title
        self.total = total
        self.warmup = warmup
        self._stream = stream
        self._mininterval = mininterval
        self._bar: tqdm[Any] | None = None

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._bar = tqdm(
            total=self.total,
            desc=self.title,
            unit="step",
            file=_ProgressLines(self._stream or sys.stdout),
            ascii=True,  # the launcher's relay writes whatever the terminal's encoding is
            mininterval=self._mininterval,
            leave=False,  # closing would draw the last line once more
            postfix=self._phase(0),
        )

    def _phase(self, done: int) -> str:
        """What the next step is: a warm-up step or a measured one."""
        return "measured" if done >= self.warmup else "warm-up"

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self._bar is None:
            return
        self._bar.set_postfix_str(self._phase(self._bar.n + 1), refresh=False)
        self._bar.update(1)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close()

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        self._close()

    def _close(self) -> None:
        if self._bar is None:
            return
        if self._bar.last_print_n < self._bar.n:  # the last steps fell inside mininterval
            self._bar.refresh()
        self._bar.close()
        self._bar = None


class InPlaceProgress:
    """A text stream over a terminal that redraws progress lines over each other.

    A line with :data:`PROGRESS_TAG` replaces the progress line before it (carriage
    return, clear to the end of the line); any other line first ends the progress line,
    so nothing is overwritten but a bar. The bench puts it in place of ``sys.stdout`` while
    a job runs, where the launcher's relay writes the ranks' lines, whole, one per call.

    Args:
        stream: The terminal.
    """

    def __init__(self, stream: IO[str]) -> None:
        self._stream = stream
        self._open = False

    def write(self, text: str) -> int:
        for line in text.splitlines(keepends=True):
            if PROGRESS_TAG in line:
                self._stream.write("\r" + line.rstrip("\n") + "\x1b[K")
                self._open = True
                continue
            self.end_line()
            self._stream.write(line)
        return len(text)

    def end_line(self) -> None:
        """End a progress line left open (before anything else writes to the terminal)."""
        if self._open:
            self._stream.write("\n")
            self._open = False

    def flush(self) -> None:
        self._stream.flush()

    def isatty(self) -> bool:
        return True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)  # encoding, fileno, ... of the terminal
