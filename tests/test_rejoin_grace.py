"""A supervisor that died and is started again finds its roles still there (issue 37, item 4).

Roles used to stop themselves 3 s into their supervisor's silence and exit 0, which compose's
``restart: on-failure`` does not restart: a supervisor restarted by its orchestrator found nobody.
Now a role a watch-only supervisor watches keeps running and beating through the silence for the
rejoin grace, is taken back when the supervisor is heard again, and only past the grace stops, as
"lost its supervisor", which its process reports with a non-zero exit code of its own. Roles of
``zmqrl launch`` keep leaving after ``heartbeat_timeout``. The links run on a fake clock, over real
sockets; the real run (SIGKILL the supervisor, start it again) is tests/test_supervise_rejoin.py.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from zmqrl.cli.process import role_exit_code
from zmqrl.config import load_config
from zmqrl.runtime.exits import EXIT_LOST_SUPERVISOR
from zmqrl.runtime.link import PARENT_PID_ENV, SupervisorLink
from zmqrl.runtime.supervisor_watch import REJOIN_GRACE_SECONDS, SupervisorWatch
from zmqrl.transport import sockets, wire
from zmqrl.transport.control import ControlPublisher
from zmqrl.transport.wire import HeartbeatMsg

LIMITS = sockets.SocketLimits(samples_hwm=2, linger_ms=0)
HEARTBEAT_TIMEOUT = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Rig:
    """A role's link on a fake clock, with the supervisor's two sockets on the other end."""

    def __init__(self, ctx: zmq.Context, tmp_path: Path) -> None:
        self.pub, control = sockets.control_pub(ctx, f"ipc://{tmp_path}/control", LIMITS)
        self.pull, heartbeat = sockets.heartbeat_pull(ctx, f"ipc://{tmp_path}/heartbeat", LIMITS)
        cfg = load_config(
            None,
            [
                f"transport.control={control}",
                f"transport.heartbeat={heartbeat}",
                f"supervisor.heartbeat_timeout={HEARTBEAT_TIMEOUT}",
                "supervisor.heartbeat_interval=1",
            ],
        )
        self.clock = FakeClock()
        self.stop = threading.Event()
        # start=False: no heartbeat thread; each tick() services the link at once on the fake clock.
        self.link = SupervisorLink(
            ctx, cfg, "learner", 0, self.stop, clock=self.clock, watch_supervisor=True, start=False
        )
        self.supervisor = ControlPublisher(self.pub)

    def supervisor_beats(self) -> None:
        """One supervisor heartbeat, heard by the role at the fake clock's now."""
        link, now = self.link, self.clock.now
        deadline = time.monotonic() + 10
        while (link.control.supervisor_seen or -1.0) < now:  # PUB/SUB: resend until one is through
            assert time.monotonic() < deadline, f"the supervisor's heartbeat at t={now} never arrived"
            self.supervisor.heartbeat()
            link._ctl_sock.poll(20)
            link._next_control = 0.0  # the control socket is read at most once per poll interval
            assert not link.tick(dict)

    def silent_for(self, seconds: float, step: float = 0.5) -> bool:
        """Tick through ``seconds`` of the supervisor's silence; whether the role stopped in it."""
        end = self.clock.now + seconds
        while self.clock.now < end:
            self.clock.now = min(end, self.clock.now + step)
            if self.link.tick(dict):
                return True
        return False

    def beats_received(self) -> int:
        n = 0
        while self.pull.poll(0):
            assert isinstance(wire.load(self.pull.recv_multipart()), HeartbeatMsg)
            n += 1
        return n

    def close(self) -> None:
        self.link.close()


@pytest.fixture
def rig(ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Rig]:
    monkeypatch.delenv(PARENT_PID_ENV, raising=False)  # started by an orchestrator, not by launch
    made = Rig(ctx, tmp_path)
    yield made
    made.close()


def test_a_watched_role_keeps_running_and_beating_through_the_grace_and_is_taken_back(rig: Rig) -> None:
    rig.clock.now = 1.0
    rig.supervisor_beats()
    rig.beats_received()
    # The supervisor dies: silent for all but the last second of heartbeat_timeout + the grace.
    assert not rig.silent_for(HEARTBEAT_TIMEOUT + REJOIN_GRACE_SECONDS - 1.0), "left within the grace"
    deadline = time.monotonic() + 10
    beats = rig.beats_received()
    while beats < 30 and time.monotonic() < deadline:  # one a (fake) second; ipc delivers at once
        rig.pull.poll(50)
        beats += rig.beats_received()
    assert beats >= 30, f"only {beats} heartbeats in 64 s of silence: a restarted supervisor must find it"
    # A restarted supervisor is heard: taken back, and a new silence gets the whole grace again.
    rig.supervisor_beats()
    assert not rig.silent_for(HEARTBEAT_TIMEOUT + REJOIN_GRACE_SECONDS - 1.0)
    assert rig.link.stop_reason == "" and not rig.link.lost_supervisor
    # Past the grace: it stops, and says why; its process exits non-zero, so a restart policy acts.
    assert rig.silent_for(2.0), "still running past the rejoin grace"
    assert rig.stop.is_set() and rig.link.stop_reason.startswith("supervisor silent for")
    assert rig.link.lost_supervisor
    assert role_exit_code({"state": "stopped"}, [], rig.link) == EXIT_LOST_SUPERVISOR != 0


def test_a_stop_broadcast_still_ends_a_watched_role_at_once_with_exit_0(rig: Rig) -> None:
    rig.clock.now = 1.0
    rig.supervisor_beats()
    deadline = time.monotonic() + 10
    while not rig.link.tick(dict):
        assert time.monotonic() < deadline, "the stop broadcast never arrived"
        rig.supervisor.stop("run finished")
        rig.link._ctl_sock.poll(20)
        rig.clock.now += 0.2
    assert rig.link.stop_reason == "run finished" and not rig.link.lost_supervisor
    assert role_exit_code({"state": "stopped"}, [], rig.link) == 0


def test_a_role_started_by_launch_gets_no_grace(
    ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """launch's roles die with it (parent-death signal) and no other launch takes them back: one
    whose launch hangs still leaves after heartbeat_timeout (tests/test_launch.py, for real)."""
    monkeypatch.setenv(PARENT_PID_ENV, str(os.getpid()))
    made = Rig(ctx, tmp_path)
    try:
        made.clock.now = 1.0
        made.supervisor_beats()
        assert made.silent_for(HEARTBEAT_TIMEOUT + 1.0), "a launched role waits for no other supervisor"
        assert made.link.lost_supervisor
    finally:
        made.close()


def test_the_verdicts_of_the_supervisor_watch() -> None:
    watch = SupervisorWatch(
        "tcp://sup:5558", 0.0, join_timeout=60.0, heartbeat_timeout=3.0, rejoin_grace=60.0
    )
    assert watch.judge(59.0, None) is None, "waiting for a supervisor that has not come yet"
    assert watch.judge(62.0, 60.0) is None  # heard
    assert watch.judge(100.0, 60.0) is None  # silent 40 s: within the grace
    assert watch.judge(122.0, 60.0) is None  # 62 s: heartbeat_timeout + grace is 63 s
    left = watch.judge(124.0, 60.0)
    assert left == "supervisor silent for 64 s" and watch.lost
    assert watch.judge(125.0, 60.0) is None, "the reason to leave is given once"
    never = SupervisorWatch(
        "tcp://sup:5558", 0.0, join_timeout=10.0, heartbeat_timeout=3.0, rejoin_grace=60.0
    )
    reason = never.judge(11.0, None)
    assert reason is not None and reason.startswith("no supervisor at tcp://sup:5558 within 10 s")
    assert not never.lost, "no supervisor ever came: nothing was lost (exit 0, as before)"


def test_the_exit_code_of_a_role_says_what_ended_it() -> None:
    class Lost:
        lost_supervisor = True

    lost = Lost()
    assert role_exit_code({"state": "stopped"}, [15], lost) == 143, "a signal from outside says so first"  # type: ignore[arg-type]
    assert role_exit_code({"state": "failed"}, [], lost) == 1  # type: ignore[arg-type]
    assert role_exit_code({"state": "stopped"}, [], lost) == EXIT_LOST_SUPERVISOR  # type: ignore[arg-type]
    assert role_exit_code({"state": "stopped"}, []) == 0
