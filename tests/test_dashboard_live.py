"""The supervisor's console (issue 11 item 1): a live dashboard on a terminal, with every line the
supervisor says printed above it and the final summary below it once it is down; plain progress
lines off a terminal; and the supervisor's scalars at each progress tick (item 2).

The terminal is a recorded rich Console writing to a StringIO (``force_terminal``), or, for whole
supervisors, the StringIO itself with ``dashboard=True``; the real terminal is tests/test_dashboard_tmux.py.
"""

from __future__ import annotations

import io
import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from rich.console import Console
from rich.text import Text

from tests.conftest import tiny_config, wait_until
from zmqrl.runtime.link import socket_limits
from zmqrl.supervisor.live import REFRESH_SECONDS, ConsoleView
from zmqrl.supervisor.liveness import Liveness
from zmqrl.supervisor.monitor import RunMonitor
from zmqrl.supervisor.summary import Slot
from zmqrl.supervisor.watch import Watcher
from zmqrl.transport.wire import HeartbeatMsg

HIDE_CURSOR, SHOW_CURSOR = "\x1b[?25l", "\x1b[?25h"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def plain(text: str) -> str:
    return ANSI.sub("", text)


def terminal() -> tuple[io.StringIO, Console]:
    out = io.StringIO()
    return out, Console(file=out, force_terminal=True, record=True, width=120, color_system=None)


# ------------------------------------------------------------------ the view alone


def test_lines_said_while_the_view_runs_are_printed_above_it_and_the_summary_below_it() -> None:
    out, console = terminal()
    view = ConsoleView(out, dashboard=True, console=console)
    view.start()
    view.show(Text("FRAME one"), now=0.0)
    print("[    3.0s] warning: actor-0 exited with code -9; restarting it in 0.5 s", file=view, flush=True)
    view.show(Text("FRAME two"), now=1.0)
    view.stop()
    print("== learner ==", file=view)

    recorded = console.export_text()
    said = recorded.index("warning: actor-0 exited")
    assert recorded.index("FRAME one") < said < recorded.rindex("FRAME two"), recorded
    raw = out.getvalue()
    assert HIDE_CURSOR in raw and raw.rindex(SHOW_CURSOR) > raw.rindex(HIDE_CURSOR), "cursor given back"
    assert raw.rindex("FRAME two") < raw.rindex(SHOW_CURSOR) < raw.index("== learner =="), raw


def test_a_line_written_in_pieces_is_printed_once_whole() -> None:
    out, console = terminal()
    view = ConsoleView(out, dashboard=True, console=console)
    view.start()
    view.write("last lines of ")
    view.write("runs/t/logs/actor-0.log:\n    Traceback [most recent call last]\n")
    view.stop()
    recorded = console.export_text()
    assert "last lines of runs/t/logs/actor-0.log:" in recorded
    assert "Traceback [most recent call last]" in recorded, "brackets are text, not rich markup"


def test_off_a_terminal_nothing_is_drawn_and_lines_go_straight_through() -> None:
    out = io.StringIO()  # isatty() is False: CI, docker logs, | tee
    view = ConsoleView(out)
    assert not view.dashboard
    view.start()
    assert not view.live and not view.due(1e9)
    view.show(Text("FRAME"), now=0.0)
    print("[    1.0s] learner finished; stopping actors", file=view)
    view.stop()
    assert out.getvalue() == "[    1.0s] learner finished; stopping actors\n"


def test_the_view_is_redrawn_at_most_every_refresh_seconds() -> None:
    _, console = terminal()
    view = ConsoleView(io.StringIO(), dashboard=True, console=console)
    view.start()
    assert view.due(10.0)
    view.show(Text("x"), now=10.0)
    assert not view.due(10.0 + REFRESH_SECONDS * 0.9)
    assert view.due(10.0 + REFRESH_SECONDS)
    view.stop()
    assert not view.due(1e9), "a stopped view is never due"


def test_a_closed_terminal_never_raises_into_the_supervisor() -> None:
    out = io.StringIO()
    view = ConsoleView(out, dashboard=True)
    view.start()
    out.close()  # the terminal went away (ssh dropped, pipe closed)
    view.show(Text("FRAME"), now=0.0)
    print("warning: still shutting the children down", file=view, flush=True)
    view.stop()
    print("== learner ==", file=view, flush=True)


class FakeTty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_log_records_for_the_same_terminal_are_printed_above_the_view_while_it_runs() -> None:
    out, console = terminal()
    tty = FakeTty()
    handler = logging.StreamHandler(tty)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        view = ConsoleView(out, dashboard=True, console=console)
        view.start()
        logging.getLogger("zmqrl.supervisor").warning("cannot write metrics: disk full")
        view.stop()
        logging.getLogger("zmqrl.supervisor").warning("after the view")
    finally:
        root.removeHandler(handler)
    assert "cannot write metrics: disk full" in console.export_text()
    assert tty.getvalue() == "after the view\n", "the handler has its own stream back"


# ------------------------------------------------------------------ whole supervisors


def stop_with_sigint_once(out: io.StringIO, text: str) -> threading.Thread:
    """SIGINT to this process once ``text`` shows in ``out`` (what Ctrl-C does to a supervisor)."""

    def run() -> None:
        wait_until(lambda: text in plain(out.getvalue()), 20, f"{text!r} on the terminal")
        os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.fixture
def zctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_ctrl_c_takes_the_dashboard_down_before_the_summary(tmp_path: Path, zctx: zmq.Context) -> None:
    out = io.StringIO()
    watcher = Watcher(tiny_config(tmp_path), out=out, ctx=zctx, dashboard=True)
    sigint = stop_with_sigint_once(out, "process")  # the table's header: the dashboard is up
    assert watcher.run() == 130
    sigint.join(timeout=5)
    raw = out.getvalue()
    shown = raw.rindex(SHOW_CURSOR)
    assert raw.rindex(HIDE_CURSOR) < shown < raw.index("== learner =="), plain(raw)
    assert plain(raw).index("SIGINT received") < plain(raw).rindex("finished"), "said above the last frame"
    assert "finished" in plain(raw[raw.rindex("zmqrl ", 0, shown) : shown]), "the last frame says so"


class Failing(Watcher):
    def _run(self) -> int:
        self._pump(10)
        raise RuntimeError("a bug in the supervisor")


def test_an_exception_still_gives_the_terminal_back(tmp_path: Path, zctx: zmq.Context) -> None:
    out = io.StringIO()
    with pytest.raises(RuntimeError, match="a bug"):
        Failing(tiny_config(tmp_path), out=out, ctx=zctx, dashboard=True).run()
    raw = out.getvalue()
    assert HIDE_CURSOR in raw and raw.rindex(SHOW_CURSOR) > raw.rindex(HIDE_CURSOR)


def test_plain_mode_prints_no_terminal_codes(tmp_path: Path, zctx: zmq.Context) -> None:
    out = io.StringIO()
    watcher = Watcher(tiny_config(tmp_path), out=out, ctx=zctx)  # auto: a StringIO is no terminal
    sigint = stop_with_sigint_once(out, "watching run")
    assert watcher.run() == 130
    sigint.join(timeout=5)
    assert "\x1b" not in out.getvalue()
    assert "SIGINT received" in out.getvalue() and "== learner ==" in out.getvalue()


# ------------------------------------------------------------------ progress ticks


class Recorder:
    """A Logger double: every scalar as (tag, value, step)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, float, int]] = []
        self.closed = False

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.rows.append((tag, value, step))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def heard(slot: Slot, t: float, state: str = "running", **counters: float) -> None:
    slot.live.heard(HeartbeatMsg(slot.role, slot.id, 100 + slot.id, t, state, counters, {"host": "h"}), t)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def slots_of_a_running_run(clock: Clock) -> dict[str, Slot]:
    learner = Slot("learner", 0, Liveness(started=clock.now, pid=100))
    actor = Slot("actor", 0, Liveness(started=clock.now, pid=100))
    heard(learner, clock.now, updates=120, samples=900, replay_size=900, updates_per_s=60)
    heard(actor, clock.now, steps=400, samples=400, steps_per_s=400, samples_per_s=400, recent_return=21.5)
    return {"learner-0": learner, "actor-0": actor}


def test_each_progress_tick_prints_the_plain_line_and_writes_the_supervisor_scalars(
    tmp_path: Path, zctx: zmq.Context
) -> None:
    cfg = tiny_config(tmp_path, supervisor__metrics_http="null")  # only the progress lines are said
    clock, out, scalars = Clock(), io.StringIO(), Recorder()
    slots = slots_of_a_running_run(clock)
    said: list[str] = []
    monitor = RunMonitor(
        cfg,
        ConsoleView(out),
        slots,
        lambda: "running",
        said.append,
        command="launch",
        clock=clock,
        scalars=scalars,
    )
    monitor.open(zctx, time.time(), socket_limits(cfg), None)
    try:
        monitor.progress(actors_alive=1, bad_heartbeats=2)
        clock.now += 1.0
        heard(slots["actor-0"], clock.now, steps=900, samples=900, recent_return=22.5)
        heard(slots["learner-0"], clock.now, updates=180, samples=1400)
        monitor.progress(actors_alive=1, bad_heartbeats=2)
    finally:
        monitor.close()
    assert len(said) == 2 and said[0].startswith("updates 120/300 | samples 900 | "), said
    assert "actors 1/1" in said[0] and "upd/s" in said[0] and "steps/s" in said[0]
    latest = {tag: (value, step) for tag, value, step in scalars.rows}
    assert latest == {
        "actor/steps_per_s": (500.0, 180),  # (900 - 400) steps over the second between the ticks
        "actor/samples_per_s": (500.0, 180),
        "actor/alive": (1.0, 180),
        "actor/recent_return": (22.5, 1400),  # against env steps, as the learner's return curves
        "supervisor/restarts": (0.0, 180),
        "supervisor/bad_heartbeats": (2.0, 180),
    }
    assert scalars.closed


def test_on_a_terminal_the_tick_writes_scalars_but_no_line(tmp_path: Path, zctx: zmq.Context) -> None:
    cfg = tiny_config(tmp_path, supervisor__metrics_http="null")  # only the progress lines are said
    clock, scalars = Clock(), Recorder()
    _, console = terminal()
    view = ConsoleView(io.StringIO(), dashboard=True, console=console)
    said: list[str] = []
    monitor = RunMonitor(
        cfg,
        view,
        slots_of_a_running_run(clock),
        lambda: "running",
        said.append,
        command="launch",
        clock=clock,
        scalars=scalars,
    )
    monitor.open(zctx, time.time(), socket_limits(cfg), None)
    view.start()
    try:
        monitor.refresh()
        monitor.progress(actors_alive=1, bad_heartbeats=0)
    finally:
        monitor.close()
    assert said == [] and scalars.rows
    recorded = console.export_text()
    assert "learner-0" in recorded and "actor-0" in recorded and "100@h" in recorded
