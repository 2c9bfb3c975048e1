"""Signal handlers set a flag and nothing else (issue 23, item 4).

A handler runs on the main thread between two bytecodes, wherever that thread is: one that prints
through the supervisor's console view, or sets a role's stop Event, blocks forever on a lock the
main thread itself holds at that moment (the view's while it redraws, the Event's inside wait()).
Each test holds that lock on the main thread, delivers the signal there, and lets a rescue thread
release the lock after a while: a handler that needed the lock was rescued, which fails the test
instead of hanging it."""

from __future__ import annotations

import io
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import tiny_config, wait_until
from zmqrl.cli.process import on_stop_signals
from zmqrl.supervisor.watch import Watcher

# How long the main thread holds the lock before the rescue thread gives it up for it.
RESCUE_AFTER_SECONDS = 3.0


@contextmanager
def held_by_this_thread(lock: Any) -> Iterator[threading.Event]:
    """Hold ``lock`` on this thread; yields an Event that is set if the rescue had to release it."""
    rescued, done = threading.Event(), threading.Event()
    lock.acquire()

    def rescue() -> None:
        if not done.wait(RESCUE_AFTER_SECONDS):
            rescued.set()
            lock.release()

    thread = threading.Thread(target=rescue, daemon=True)
    thread.start()
    try:
        yield rescued
    finally:
        done.set()
        thread.join()
        if not rescued.is_set():
            lock.release()


@contextmanager
def restored_handlers() -> Iterator[None]:
    previous = {n: signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def test_ctrl_c_while_the_supervisor_console_is_mid_redraw_does_not_deadlock(tmp_path: Path) -> None:
    out = io.StringIO()
    sup = Watcher(tiny_config(tmp_path), out=out, dashboard=False)
    sup._t0 = 0.0
    with restored_handlers():
        sup._install_signals()
        with held_by_this_thread(sup.view._lock) as rescued:  # the loop is inside view.write / show
            signal.raise_signal(signal.SIGINT)  # the handler runs here, on this thread
        assert not rescued.is_set(), "the SIGINT handler blocked on the console's lock"
        assert sup._signal == signal.SIGINT
        assert "SIGINT received" not in out.getvalue(), "the handler printed"
        sup._heed_signals()  # the loop's next turn says it
        assert "SIGINT received: stopping every process" in out.getvalue()


def test_a_second_ctrl_c_is_a_flag_too_and_the_loop_kills_the_children(tmp_path: Path) -> None:
    sup = Watcher(tiny_config(tmp_path), out=io.StringIO(), dashboard=False)
    sup._t0 = 0.0
    killed: list[bool] = []
    sup._second_signal = lambda: killed.append(True)  # type: ignore[method-assign]
    with restored_handlers():
        sup._install_signals()
        with held_by_this_thread(sup.view._lock) as rescued:
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGTERM)
        assert not rescued.is_set()
        assert killed == [], "the handler acted"
        sup._heed_signals()
        sup._heed_signals()
        assert killed == [True]


def test_sigterm_while_a_role_waits_on_its_stop_event_does_not_deadlock() -> None:
    """Event.wait() holds the Event's lock between its check and its wait: a handler that set the
    Event there blocked forever. The role is asked to stop by a thread instead."""
    stop = threading.Event()
    received: list[int] = []
    with restored_handlers():
        on_stop_signals(stop.set, received)
        with held_by_this_thread(stop._cond) as rescued:  # type: ignore[attr-defined]
            signal.raise_signal(signal.SIGTERM)
        assert not rescued.is_set(), "the SIGTERM handler blocked on the stop event's lock"
        assert received == [signal.SIGTERM]
        wait_until(stop.is_set, 5, "the stop to reach the role")
