"""Ctrl-C and SIGTERM in the tuner: delivered while a trial's run is followed, deferred while the
study is written.

Python raises KeyboardInterrupt wherever the main thread happens to be. In the middle of a write to
the study (Optuna's SQLAlchemy session committing a trial's report) that leaves the database
connection inside its transaction: on SQLite its lock is never released, and the writes that save
the interrupted trial and enqueue it again fail with "database is locked" (seen in the tests: the
signal came just as the run's first evaluation was reported). So the tuner's handler raises only
where nothing is being written, inside :meth:`Interrupts.following` and outside
:meth:`Interrupts.writing`; anywhere else the signal waits, and is raised when the write ends (or
when the next run is followed, or when the trial loop looks: :meth:`Interrupts.check`). A second
signal while one waits is raised at once: a user who presses Ctrl-C twice means it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class Interrupts:
    """The tuner process's signal state (one instance, :data:`INTERRUPTS`)."""

    def __init__(self) -> None:
        self.pending: int | None = None
        self._following = 0
        self._writing = 0

    def signal(self, signum: int) -> None:
        """The handler of SIGINT and SIGTERM: KeyboardInterrupt(signum) now, or when it is safe."""
        if (self._following and not self._writing) or self.pending is not None:
            self.pending = None
            raise KeyboardInterrupt(signum)
        self.pending = signum

    def check(self) -> None:
        """Raise the signal that waited, if one did."""
        if self.pending is not None:
            signum, self.pending = self.pending, None
            raise KeyboardInterrupt(signum)

    @contextmanager
    def following(self) -> Iterator[None]:
        """While a trial's run is followed (waiting on it): signals interrupt at once."""
        self.check()
        self._following += 1
        try:
            yield
        finally:
            self._following -= 1

    @contextmanager
    def writing(self) -> Iterator[None]:
        """While the study is written: signals wait until the write is done."""
        self._writing += 1
        try:
            yield
        finally:
            self._writing -= 1
        if self._following and not self._writing:
            self.check()


INTERRUPTS = Interrupts()
