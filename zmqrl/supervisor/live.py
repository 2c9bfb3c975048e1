"""The supervisor's console: a live dashboard on a terminal, plain lines everywhere else.

On a terminal (or with ``--dashboard``) the run is drawn with ``rich.live.Live`` from the
supervisor's own loop, at most every :data:`REFRESH_SECONDS`: no refresh thread, because the
loop wakes ten times a second anyway and a thread that draws must not race the loop that says
things. Everything the supervisor says (warnings, restarts, "learner finished", log records that
would go to the same terminal) is written to this object as to a text stream; while the view
runs each line is printed *above* it, so none is lost or overdrawn, and after :meth:`stop` (which
the supervisor calls before the final summary, even on Ctrl-C or an exception) lines go straight
to the stream again. Off a terminal (CI, ``docker logs``, ``| tee``) nothing is drawn: lines go
to the stream as they always did, and the supervisor prints a plain progress line instead.

A closed terminal or pipe must never stop a supervisor from shutting its children down, so every
write to the stream swallows the stream's errors (:class:`SafeStream`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import IO, TextIO

from rich.console import Console, RenderableType
from rich.live import Live
from rich.text import Text

# Seconds between redraws of the live view (about 2 a second: cheap, and readable).
REFRESH_SECONDS = 0.5


class SafeStream:
    """A text stream whose write errors (closed terminal, broken pipe) are swallowed."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def isatty(self) -> bool:
        try:
            return bool(self._stream.isatty())
        except (OSError, ValueError, AttributeError):
            return False


class ConsoleView:
    """The supervisor's output: a text stream that is also, on a terminal, a live dashboard.

    ``dashboard``: None decides by ``stream.isatty()``; True / False force it (``--dashboard`` /
    ``--plain``). ``console`` replaces the rich Console the view draws with (tests pass a
    recording one). The view draws nothing until :meth:`start` and after :meth:`stop`.
    """

    def __init__(
        self, stream: TextIO, *, dashboard: bool | None = None, console: Console | None = None
    ) -> None:
        self._stream = SafeStream(stream)
        self.dashboard = self._stream.isatty() if dashboard is None else dashboard
        self._console = console
        self._live: Live | None = None
        self._partial = ""  # text written since the last newline, while the view runs
        self._lock = threading.Lock()  # log records may come from other threads (the authenticator)
        self._next_draw = -float("inf")
        self._captured: list[tuple[logging.StreamHandler[IO[str]], IO[str]]] = []

    @property
    def live(self) -> bool:
        """Whether the live view is on the terminal now."""
        return self._live is not None

    # ------------------------------------------------------------------ the live view
    def start(self) -> None:
        """Put the live view on the terminal (a no-op in plain mode or when already started)."""
        if not self.dashboard or self._live is not None:
            return
        console = self._console or Console(file=self._stream, force_terminal=True)  # type: ignore[arg-type]
        live = Live(
            console=console,
            auto_refresh=False,  # drawn from the supervisor's loop: see the module docstring
            redirect_stdout=False,
            redirect_stderr=False,
            transient=False,  # the last frame stays on screen above the final summary
        )
        live.start()
        self._live = live
        self._capture_logs()

    def due(self, now: float) -> bool:
        """Whether the live view should be redrawn at ``now`` (the caller's clock)."""
        return self._live is not None and now >= self._next_draw

    def show(self, renderable: RenderableType, now: float) -> None:
        """Redraw the live view with ``renderable``; the next redraw is due REFRESH_SECONDS later."""
        self._next_draw = now + REFRESH_SECONDS
        live = self._live
        if live is not None:
            with self._lock, contextlib.suppress(OSError, ValueError):
                live.update(renderable, refresh=True)

    def stop(self) -> None:
        """Take the live view down, leaving its last frame and a visible cursor; idempotent, and
        safe to call from a ``finally`` after anything went wrong."""
        live = self._live
        if live is None:
            return
        self._release_logs()
        with self._lock:
            rest, self._partial = self._partial, ""
            if rest:
                self._print_above(live, rest)
            self._live = None
            try:
                live.stop()
            except Exception:  # the terminal must be given back whatever rich ran into
                with contextlib.suppress(Exception):
                    live.console.show_cursor(True)

    # ------------------------------------------------------------------ the text stream
    def write(self, text: str) -> int:
        """Print ``text``: above the live view while it runs (line by line), else to the stream."""
        with self._lock:
            live = self._live
            if live is None:
                return self._stream.write(text)
            self._partial += text
            while "\n" in self._partial:
                line, self._partial = self._partial.split("\n", 1)
                self._print_above(live, line)
        return len(text)

    def flush(self) -> None:
        if self._live is None:
            self._stream.flush()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @staticmethod
    def _print_above(live: Live, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            # Text: a line's brackets are not rich markup; soft_wrap: the terminal wraps a long line
            # as it would without the view, so a path in it stays one piece to copy.
            live.console.print(Text(line), soft_wrap=True)

    # ------------------------------------------------------------------ log records
    def _capture_logs(self) -> None:
        """Log handlers that write to this terminal write through the view while it runs, so a
        log record is printed above it instead of tearing it."""
        for handler in logging.getLogger().handlers:
            if type(handler) is not logging.StreamHandler:  # not files, not pytest's capture
                continue
            stream = handler.stream
            try:
                on_terminal = bool(stream.isatty())
            except (OSError, ValueError, AttributeError):
                on_terminal = False
            if on_terminal:
                handler.setStream(self)
                self._captured.append((handler, stream))

    def _release_logs(self) -> None:
        for handler, stream in self._captured:
            handler.setStream(stream)
        self._captured = []
