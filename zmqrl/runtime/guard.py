"""Background threads that cannot die quietly.

A thread that dies of an exception leaves a half-alive process: its heartbeats (from another
thread) say "fine" while, say, replay stops filling. Every long-lived thread in zmqrl is started
with ``start_guarded``: an unexpected exception is logged with its traceback and handed to the
owner's ``on_crash`` (which makes the role's main loop raise, so the process exits non-zero and
the supervisor restarts it). ``install_process_guard`` is the backstop for a process main: any
thread's uncaught exception, guarded or not, ends the process with EXIT_THREAD_DIED once the
owner had ``CRASH_GRACE_SECONDS`` to exit on its own.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from types import TracebackType

# Exit code of a process ended because one of its threads died (a bug: like an uncaught exception).
EXIT_THREAD_DIED = 1
# How long the process backstop lets the main thread shut down cleanly before it forces the exit.
CRASH_GRACE_SECONDS = 10.0

log = logging.getLogger("zmqrl.runtime.guard")


class ThreadDied(RuntimeError):
    """Raised in a role's main thread when one of its background threads died."""


def start_guarded(
    target: Callable[[], None], name: str, on_crash: Callable[[BaseException], None]
) -> threading.Thread:
    """Start ``target`` in a daemon thread; if it raises, log the traceback and call ``on_crash``."""

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            log.critical("thread %r died:\n%s", name, "".join(traceback.format_exception(exc)))
            on_crash(exc)
            _escalate(name)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


_process_guard = False


def install_process_guard() -> None:
    """For process mains: a thread's uncaught exception (or a guarded one's crash) ends the process
    with ``EXIT_THREAD_DIED`` if it is still running ``CRASH_GRACE_SECONDS`` later."""
    global _process_guard
    _process_guard = True

    def hook(args: threading.ExceptHookArgs) -> None:
        exc = args.exc_value
        name = args.thread.name if args.thread is not None else "?"
        if exc is not None and not isinstance(exc, SystemExit):
            log.critical(
                "thread %r died:\n%s", name, "".join(_format(args.exc_type, exc, args.exc_traceback))
            )
            _escalate(name)

    threading.excepthook = hook


def _escalate(name: str) -> None:
    if not _process_guard:
        return  # in-process use (tests, notebooks): the owner's on_crash is the whole story

    def force() -> None:
        log.critical(
            "thread %r died and the process did not exit in %.0f s: exiting", name, CRASH_GRACE_SECONDS
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        os._exit(EXIT_THREAD_DIED)

    timer = threading.Timer(CRASH_GRACE_SECONDS, force)
    timer.daemon = True
    timer.start()


def _format(tp: type[BaseException], exc: BaseException, tb: TracebackType | None) -> list[str]:
    return traceback.format_exception(tp, exc, tb)
