"""The supervisor's control heartbeat does not share the loop that writes to the console (issue 23,
item 5): with the console blocked (a terminal paused with Ctrl-S, a pipe nobody reads) the roles
still hear the supervisor, so they stay up, and the run stops cleanly once the console moves."""

from __future__ import annotations

import itertools
import signal
import threading
import time
from pathlib import Path

import zmq

from tests.conftest import tiny_config, wait_until
from zmqrl.supervisor.watch import Watcher
from zmqrl.transport import wire
from zmqrl.transport.wire import HeartbeatMsg

# How long the console stays blocked: several heartbeat timeouts of the config below.
BLOCKED_SECONDS = 3.0


class PausedTerminal:
    """A text stream whose writes block until ``resume`` (Ctrl-S ... Ctrl-Q)."""

    def __init__(self) -> None:
        self.resumed = threading.Event()
        self.blocked = threading.Event()  # a write is waiting
        self.text: list[str] = []

    def write(self, text: str) -> int:
        if not self.resumed.is_set():
            self.blocked.set()
            self.resumed.wait()
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def supervisor_beats(sock: zmq.Socket, seconds: float) -> list[float]:
    """Times of the supervisor heartbeats heard on a control subscription over ``seconds``."""
    heard: list[float] = []
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            msg = wire.load(sock.recv_multipart())
            if isinstance(msg, HeartbeatMsg) and msg.role == "supervisor":
                heard.append(time.monotonic())
    return heard


def test_a_blocked_console_does_not_silence_the_supervisors_heartbeat(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    cfg = tiny_config(
        tmp_path,
        supervisor__heartbeat_interval=0.1,
        supervisor__heartbeat_timeout=0.5,
        supervisor__stop_grace=1.0,
    )
    terminal = PausedTerminal()
    watcher = Watcher(cfg, out=terminal, dashboard=False, ctx=ctx)  # type: ignore[arg-type]
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        assert terminal.blocked.wait(30), "the supervisor never wrote to its console"
        wait_until(lambda: watcher.cfg.transport.control != cfg.transport.control, 10, "the control socket")
        role = ctx.socket(zmq.SUB)  # what every role's link listens to
        role.setsockopt(zmq.SUBSCRIBE, b"")
        role.connect(watcher.cfg.transport.control)
        beats = supervisor_beats(role, BLOCKED_SECONDS)
        role.close(linger=0)
        assert terminal.text == [], "the console was not blocked"
        assert len(beats) >= BLOCKED_SECONDS / 0.1 / 2, f"{len(beats)} heartbeats in {BLOCKED_SECONDS} s"
        gaps = [b - a for a, b in itertools.pairwise(beats)]
        assert max(gaps) < cfg.supervisor.heartbeat_timeout, "a role would have left"
    finally:
        terminal.resumed.set()
        watcher._signal = signal.SIGINT  # as its handler does: the loop stops the run
        watcher._signals = 1
        thread.join(timeout=30)
    assert not thread.is_alive(), "the supervisor did not stop once its console moved"
    assert "SIGINT received" in "".join(terminal.text)
