"""Every role watches itself (issue 23, item 9): when its main loop makes no progress for the role's
hung timeout, its watchdog ends the process with exit 3 and every thread's stack in the log, so
any orchestrator (ours, compose's `restart: on-failure`, Kubernetes) replaces it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import zmq

from tests.conftest import tiny_config, wait_until
from zmqrl.runtime import link as link_module
from zmqrl.runtime.exits import EXIT_HUNG
from zmqrl.runtime.health import read_health
from zmqrl.runtime.link import SupervisorLink
from zmqrl.runtime.watchdog import Watchdog


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_watchdog_fires_after_the_limit_without_progress_and_not_before() -> None:
    clock = Clock()
    dog = Watchdog("actor-0", limit=6.0, startup_limit=120.0, clock=clock)
    clock.now = 100.0
    assert dog.check(0) is None, "still starting: the start-up limit applies"
    clock.now = 121.0
    assert "has not started" in str(dog.check(0))
    for t in range(122, 140):  # ticking: never hung
        clock.now = float(t)
        assert dog.check(t) is None
    clock.now = 144.9  # the last tick (progress 139) came at 139.0
    assert dog.check(139) is None
    clock.now = 145.1
    reason = dog.check(139)
    assert reason is not None and reason.startswith("actor-0 hung: its main loop made no progress for 6.1 s")


def test_a_linked_role_whose_main_loop_stops_is_ended_by_its_watchdog_while_ticks_keep_it_alive(
    ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watchdog runs on the heartbeat thread: a main loop that ticks (even only waiting) is
    never taken for hung; once it stops, the process is ended within the limit."""
    ended: list[str] = []
    monkeypatch.setattr(link_module, "end_hung_process", ended.append)
    cfg = tiny_config(
        tmp_path,
        supervisor__actor_progress_timeout=0.6,
        transport__heartbeat=f"ipc://{tmp_path}/hb",
        transport__control=f"ipc://{tmp_path}/ctl",
    )
    link = SupervisorLink(
        ctx, cfg, "actor", 0, watch_supervisor=False, health_file=tmp_path / "health.json", watchdog=True
    )
    try:
        stop = threading.Event()
        for _ in range(15):  # 1.5 s of a loop that only waits, but ticks
            link.tick(lambda: {}, state="waiting")
            stop.wait(0.1)
        assert ended == []
        wait_until(lambda: ended, 5, "the watchdog to end the hung role")
        assert ended[0].startswith("actor-0 hung: its main loop made no progress for")
        assert read_health(tmp_path / "health.json").state == "hung"
    finally:
        link.close()


HUNG_ROLE = textwrap.dedent(
    """
    import sys, threading, zmq
    from zmqrl.config import load_config
    from zmqrl.runtime.link import SupervisorLink

    cfg = load_config(None, sys.argv[1:])
    link = SupervisorLink(zmq.Context.instance(), cfg, "actor", 0, watch_supervisor=False, watchdog=True)

    def stuck_in_the_main_loop():
        threading.Event().wait()

    for _ in range(3):
        link.tick(lambda: {})
    stuck_in_the_main_loop()
    """
)


def test_a_hung_role_process_exits_3_with_its_main_threads_stack_in_the_log(tmp_path: Path) -> None:
    sets = [
        "supervisor.actor_progress_timeout=0.5",
        f"transport.heartbeat=ipc://{tmp_path}/hb",
        f"transport.control=ipc://{tmp_path}/ctl",
        f"run.dir={tmp_path}",
    ]
    result = subprocess.run(
        [sys.executable, "-c", HUNG_ROLE, *sets], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == EXIT_HUNG, result.stderr
    assert "actor-0 hung: its main loop made no progress for" in result.stderr
    assert "most recent call first" in result.stderr  # faulthandler's dump
    assert "stuck_in_the_main_loop" in result.stderr, result.stderr


@pytest.mark.heavy  # 15 s of a real actor in a thread
def test_an_actor_held_back_by_a_learner_that_does_not_read_is_not_taken_for_hung(
    ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Backpressure (a full queue, the replay ratio) holds an actor for as long as the learner
    wants: its send keeps ticking ("blocked"), so its watchdog never fires, however long."""
    from tests.test_roles import FakeLearner, FakeSupervisor, start, with_transport
    from zmqrl.actor.main import Actor

    ended: list[str] = []
    monkeypatch.setattr(link_module, "end_hung_process", ended.append)
    sup, fake = FakeSupervisor(ctx), FakeLearner(ctx)
    cfg = with_transport(
        tiny_config(
            tmp_path,
            supervisor__actor_progress_timeout=0.5,
            transport__samples_hwm=1,
            transport__samples_buffer_kb=4,
        ),
        **sup.endpoints(),
        **fake.endpoints(),
    )
    link = SupervisorLink(ctx, cfg, "actor", 0, watch_supervisor=False, watchdog=True)
    actor = Actor(cfg, 0, ctx=ctx, link=link)
    thread = start(actor.run)
    try:
        fake.first_sample(cfg)  # then the learner reads nothing more: the actor's queue fills
        wait_until(lambda: any(hb.state == "blocked" for hb in sup.drain()), 30, "the actor to be held back")
        blocked_from = next(hb.time for hb in sup.drain() if hb.state == "blocked")

        def beaten_for(seconds: float) -> bool:  # the heartbeat thread is the one its watchdog runs on
            assert ended == [], ended
            return sup.drain()[-1].time - blocked_from >= seconds

        wait_until(lambda: beaten_for(3.0), 30, "beats over six hung timeouts while held back")
        # A send may still get through now and then (the kernel's socket buffers grow while the
        # learner reads nothing), so the actor runs for a beat and is held back again: most of
        # its beats say so; the last one need not.
        states = [hb.state for hb in sup.drain() if hb.time >= blocked_from]
        assert states.count("blocked") > len(states) / 2, states
    finally:
        actor.request_stop()
        thread.join(timeout=30)
        fake.close()
        sup.close()
    assert not thread.is_alive()
    assert ended == []
