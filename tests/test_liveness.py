"""Liveness without processes: how a supervisor tells dead from hung from healthy (a pure record
and a clock), a heartbeat thread that beats while its main loop is busy, and background threads
that cannot die quietly (issue 9, items 1, 3, 16 and 17)."""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import zmq

from tests.conftest import tiny_config, wait_until
from zmqrl.checkpoints.snapshots import CheckpointWriter
from zmqrl.config import SupervisorConfig
from zmqrl.runtime.guard import EXIT_THREAD_DIED, ThreadDied, start_guarded
from zmqrl.runtime.health import read_health
from zmqrl.runtime.link import SupervisorLink
from zmqrl.supervisor.liveness import Liveness, os_stopped
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.control import HeartbeatReceiver
from zmqrl.transport.wire import HeartbeatMsg

# The bound: a dead or stopped process is noticed within this many seconds by default.
DETECT_WITHIN = 5.0
SCFG = SupervisorConfig(
    heartbeat_timeout=3.0, progress_timeout=60.0, startup_timeout=10.0, healthy_seconds=2.0
)


def beat(progress: int, state: str = "running", work: int = 0) -> HeartbeatMsg:
    return HeartbeatMsg("actor", 0, 123, 0.0, state, {"progress": progress, "work": work}, {})


def beating(
    live: Liveness,
    start: float,
    end: float,
    progress: int | None = None,
    every: float = 0.5,
    working: bool = True,
) -> None:
    """Heartbeats from ``start`` to ``end``; progress grows each beat unless fixed by ``progress``,
    and work with it while ``working`` (a role that only waits ticks without working)."""
    t, n, w = start, int(live.progress) if live.progress > 0 else 0, int(live.work)
    while t <= end:
        n = progress if progress is not None else n + 1
        w = w + 1 if working and progress is None else w
        live.heard(beat(n, work=w), t)
        t += every


# ---------------------------------------------------------------------- dead
def test_a_process_silent_for_heartbeat_timeout_is_dead() -> None:
    live = Liveness(started=0.0)
    beating(live, 1.0, 5.0)
    assert live.verdict(7.9, SCFG) is None
    assert live.verdict(8.1, SCFG) == "no heartbeat for 3.1 s"


def test_no_first_heartbeat_within_startup_timeout_is_dead_but_a_slow_start_is_not() -> None:
    live = Liveness(started=100.0)
    assert live.verdict(109.0, SCFG) is None  # still importing torch: fine
    reason = live.verdict(110.5, SCFG)
    assert reason is not None and "no first heartbeat" in reason


def test_a_process_stopped_by_a_signal_is_dead_after_heartbeat_timeout_even_in_start_up() -> None:
    """Item 16: stopped before its first heartbeat, it is not given the whole startup_timeout."""
    live = Liveness(started=0.0)
    live.observe_os_state(True, 0.2)
    live.observe_os_state(True, 1.0)  # still stopped: the clock runs from the first observation
    assert live.verdict(3.1, SCFG) is None
    reason = live.verdict(3.3, SCFG)
    assert reason is not None and reason.startswith("stopped by a signal")


def test_a_process_continued_after_a_stop_is_judged_by_its_heartbeats_again() -> None:
    live = Liveness(started=0.0)
    beating(live, 0.5, 2.0)
    live.observe_os_state(True, 2.1)
    live.observe_os_state(False, 3.0)  # SIGCONT
    beating(live, 3.2, 6.0)
    assert live.verdict(6.1, SCFG) is None


def test_after_its_final_heartbeat_a_process_gets_stop_grace_to_exit() -> None:
    """A finished learner closes its sockets and tears torch down after its last beat: on a loaded
    machine that took longer than heartbeat_timeout, and the supervisor killed (and restarted) it."""
    scfg = SupervisorConfig(heartbeat_timeout=2.0, stop_grace=10.0)
    live = Liveness(started=0.0)
    beating(live, 1.0, 5.0)
    live.heard(beat(int(live.progress), state="finished"), 5.2)
    assert live.verdict(12.0, scfg) is None
    assert live.verdict(15.5, scfg) == "no heartbeat for 10.3 s after it finished"


@pytest.mark.parametrize(
    ("stopped", "before_first_heartbeat", "limit"),
    [
        (True, False, DETECT_WITHIN),  # SIGSTOPped while running
        (True, True, DETECT_WITHIN),  # SIGSTOPped in start-up: the OS says so, no need to wait 10 s
        (False, False, DETECT_WITHIN),  # silent (e.g. frozen in a C call holding the GIL)
        (False, True, SupervisorConfig().startup_timeout + 0.2),  # silent in start-up: importing torch
    ],
    ids=["stopped", "stopped-in-start-up", "silent", "silent-in-start-up"],
)
def test_default_settings_notice_a_dead_or_stopped_process_in_time(
    stopped: bool, before_first_heartbeat: bool, limit: float
) -> None:
    """Item 16, against the shipped defaults (not the test's): the old 30 s / 60 s defaults failed."""
    scfg = SupervisorConfig()
    live = Liveness(started=0.0)
    if not before_first_heartbeat:
        beating(live, 1.0, 10.0, every=scfg.heartbeat_interval)
    last = live.last_seen or 0.0
    if stopped:
        live.observe_os_state(True, last + 0.1)
    times = [last + i / 10 for i in range(1, 300)]
    noticed = next(t for t in times if live.verdict(t, scfg) is not None)
    assert noticed - last < limit, live.verdict(noticed, scfg)
    assert scfg.heartbeat_interval * 3 <= scfg.heartbeat_timeout, "a few late beats must not kill"


# ---------------------------------------------------------------------- hung vs busy
def test_a_busy_process_that_beats_without_progress_is_neither_dead_nor_hung_until_progress_timeout() -> None:
    """Item 3: a learner 40 s inside a checkpoint keeps beating (its heartbeat thread) and is kept.
    Its own watchdog ends it at progress_timeout; the supervisor kills a heartbeat timeout later."""
    live = Liveness(started=0.0, role="learner")
    beating(live, 1.0, 5.0)
    beating(live, 5.5, 45.0, progress=int(live.progress))  # busy: beats, no ticks
    assert live.verdict(45.2, SCFG) is None
    beating(live, 45.5, 67.5, progress=int(live.progress))
    assert live.verdict(67.5, SCFG) is None
    beating(live, 68.0, 69.0, progress=int(live.progress))
    reason = live.verdict(69.0, SCFG)
    assert reason is not None and "no progress for" in reason and "hung" in reason


def test_an_actor_is_hung_much_sooner_than_a_learner() -> None:
    """Item 9: an actor's loop turns every few env steps, so its hung timeout is seconds."""
    scfg = SupervisorConfig()
    for role, limit in (("actor", scfg.actor_progress_timeout), ("learner", scfg.progress_timeout)):
        live = Liveness(started=0.0, role=role)
        beating(live, 1.0, 2.0)
        last_tick = live.progress_seen
        beating(live, 2.5, 2.5 + limit + scfg.heartbeat_timeout + 1.0, progress=int(live.progress))
        noticed = next(
            t / 10 for t in range(25, 2000) if live.verdict(t / 10, scfg) is not None and t / 10 > last_tick
        )
        assert noticed - last_tick == pytest.approx(limit + scfg.heartbeat_timeout, abs=0.11), role
    assert scfg.actor_progress_timeout + scfg.heartbeat_timeout < 10.0


def test_start_up_after_the_first_heartbeat_gets_startup_timeout_however_short_progress_timeout() -> None:
    """A learner restoring a replay snapshot beats (its heartbeat thread runs) before its main
    loop's first tick: with a short progress_timeout it was killed in start-up again and again."""
    scfg = SupervisorConfig(heartbeat_timeout=2.0, progress_timeout=4.0, startup_timeout=10.0)
    live = Liveness(started=0.0)
    beating(live, 0.5, 9.5, progress=0, every=0.5)  # state "starting": no tick yet
    assert live.verdict(9.6, scfg) is None
    beating(live, 10.0, 11.0, progress=0, every=0.5)
    assert "no progress" in str(live.verdict(11.0, scfg))
    ticking = Liveness(started=0.0, role="learner")
    beating(ticking, 0.5, 1.0)  # once it has ticked, progress_timeout applies (+ the watchdog's margin)
    beating(ticking, 1.5, 8.0, progress=int(ticking.progress))
    assert "hung" in str(ticking.verdict(8.0, scfg))


def test_progress_resumed_in_time_clears_a_long_pause() -> None:
    live = Liveness(started=0.0)
    beating(live, 1.0, 2.0)
    beating(live, 2.5, 50.0, progress=int(live.progress))
    beating(live, 50.5, 120.0)  # ticking again
    assert live.verdict(120.1, SCFG) is None


# ---------------------------------------------------------------------- useful work and healthy runs
HEALTHY = SupervisorConfig(heartbeat_timeout=3.0, healthy_seconds=120.0)


def test_a_process_is_healthy_after_healthy_seconds_of_useful_work_not_before() -> None:
    live = Liveness(started=0.0)
    beating(live, 1.0, 1.0, progress=0)  # heartbeating, main loop not started
    assert not live.useful and not live.healthy(HEALTHY)
    beating(live, 1.5, 60.0)
    assert live.useful and live.useful_at == 1.5
    assert not live.healthy(HEALTHY)
    beating(live, 60.5, 122.0)
    assert live.healthy(HEALTHY)


def test_waiting_is_progress_but_not_useful_work() -> None:
    """Item 3: a learner waiting for replay ticks (it is not hung) but does no work: minutes of
    waiting never make it healthy, so the restart policy still counts its crashes."""
    live = Liveness(started=0.0, role="learner")
    beating(live, 1.0, 600.0, working=False)
    assert live.verdict(600.1, HEALTHY) is None, "waiting is not a hang"
    assert not live.useful and not live.healthy(HEALTHY)


def test_a_process_that_works_then_only_waits_is_healthy_only_for_the_time_it_worked() -> None:
    live = Liveness(started=0.0)
    beating(live, 1.0, 30.0)  # 29 s of work
    beating(live, 30.5, 900.0, working=False)  # then 15 minutes held back by a full queue
    assert live.useful and not live.healthy(HEALTHY)


def test_a_blocked_supervisor_loop_is_nobodys_silence() -> None:
    """Item 5: the supervisor's own loop blocked 20 s (a paused terminal): the roles kept beating,
    it did not listen; once it listens again, silence counts from where it stopped listening."""
    live = Liveness(started=0.0)
    beating(live, 1.0, 10.0)
    live.observe_os_state(False, 10.0)
    assert live.verdict(30.5, SCFG) is not None  # judged as if it had listened: "dead"
    live.unheard(20.0)  # the loop was blocked from just after the last beat (10.0) to 30.0
    assert live.verdict(30.5, SCFG) is None
    assert live.verdict(33.1, SCFG) == "no heartbeat for 3.1 s"


def test_a_replacement_starts_with_fresh_liveness_and_keeps_the_last_counters() -> None:
    live = Liveness(started=0.0, role="actor", pid=1)
    beating(live, 1.0, 10.0)
    fresh = live.renew(11.0, pid=2)
    assert fresh.pid == 2 and fresh.role == "actor" and fresh.last is live.last
    assert fresh.last_seen is None and fresh.ready_at is None and fresh.progress == -1 and not fresh.useful


def test_os_stopped_reads_the_process_state() -> None:
    assert os_stopped(threading.get_native_id()) is False
    assert os_stopped(2**22 + 12345) is False  # no such process


# ---------------------------------------------------------------------- the heartbeat thread
@pytest.fixture
def supervisor_sockets(ctx: zmq.Context) -> tuple[HeartbeatReceiver, str, str]:
    """What a supervisor binds: a heartbeat PULL and a control PUB, on OS-chosen loopback ports."""
    hb = ctx.socket(zmq.PULL)
    hb.bind("tcp://127.0.0.1:0")
    ctl = ctx.socket(zmq.PUB)
    ctl.bind("tcp://127.0.0.1:0")
    hb_ep, ctl_ep = hb.getsockopt_string(zmq.LAST_ENDPOINT), ctl.getsockopt_string(zmq.LAST_ENDPOINT)
    return HeartbeatReceiver(hb, BadMessages("test")), hb_ep, ctl_ep


def make_link(
    ctx: zmq.Context, tmp_path: Path, sockets: tuple[HeartbeatReceiver, str, str]
) -> SupervisorLink:
    _, hb_ep, ctl_ep = sockets
    cfg = tiny_config(
        tmp_path, transport__heartbeat=hb_ep, transport__control=ctl_ep, supervisor__heartbeat_interval=0.1
    )
    return SupervisorLink(
        ctx, cfg, "learner", 0, watch_supervisor=False, health_file=tmp_path / "health.json"
    )


def test_the_heartbeat_thread_beats_while_the_main_loop_is_busy_and_reports_no_progress(
    ctx: zmq.Context, tmp_path: Path, supervisor_sockets: tuple[HeartbeatReceiver, str, str]
) -> None:
    """Item 3: alive is not progress. The main thread ticks twice, then stays busy (no tick) while
    heartbeats go on, every one carrying the same progress count."""
    receiver = supervisor_sockets[0]
    link = make_link(ctx, tmp_path, supervisor_sockets)
    try:
        link.tick(lambda: {"updates": 7})
        link.tick(lambda: {"updates": 8})
        busy_from, busy_wall = time.monotonic(), time.time()
        beats: list[HeartbeatMsg] = []
        while time.monotonic() - busy_from < 1.5 or len(beats) < 5:  # "busy": no tick in here
            beats += receiver.recv_all(100)
            assert time.monotonic() - busy_from < 30, f"only {len(beats)} heartbeats while busy"
        late = [b for b in beats if b.counters["progress"] == 2]
        assert len(late) >= 5, [b.counters for b in beats]
        assert all(b.counters["updates"] == 8 and b.state == "running" for b in late)
        record = read_health(tmp_path / "health.json")
        assert record.progress == 2 and record.progress_time <= busy_wall + 0.5
        assert time.time() - record.time < 1.0, "the health file is rewritten by every beat"
    finally:
        link.close()


def test_the_health_file_carries_what_the_heartbeats_say_besides_counters(
    ctx: zmq.Context, tmp_path: Path, supervisor_sockets: tuple[HeartbeatReceiver, str, str]
) -> None:
    """The learner's bound endpoints (port 0 resolved) reach its health file, so whoever started it
    by hand finds them there; a file without ``info`` (an older zmqrl's) still reads."""
    link = make_link(ctx, tmp_path, supervisor_sockets)
    path = tmp_path / "health.json"
    try:
        link.tick(lambda: {"updates": 1}, {"samples": "tcp://127.0.0.1:5555"})
        wait_until(lambda: path.is_file() and "samples" in read_health(path).info, 10, "a beat with info")
        info = read_health(path).info
        assert info["samples"] == "tcp://127.0.0.1:5555" and info["host"]
    finally:
        link.close()
    older = json.loads(path.read_text())
    del older["info"]
    path.write_text(json.dumps(older))
    assert read_health(path).info == {}


def test_a_role_whose_heartbeat_thread_died_is_told_at_its_next_tick(
    ctx: zmq.Context, tmp_path: Path, supervisor_sockets: tuple[HeartbeatReceiver, str, str]
) -> None:
    """Item 1 for the link's own thread: a counters callback that raises kills the heartbeat thread;
    the role must not run on unobserved, so its stop event is set and tick() raises."""
    link = make_link(ctx, tmp_path, supervisor_sockets)
    try:
        link.tick(lambda: {"updates": 1 // 0})
        wait_until(link.stop_event.is_set, 10, "the dead heartbeat thread to stop the role")
        with pytest.raises(ThreadDied, match="heartbeat thread of learner-0 died"):
            link.tick(lambda: {})
    finally:
        link.close()


# ---------------------------------------------------------------------- guarded threads
def test_a_guarded_thread_that_raises_logs_its_traceback_and_calls_on_crash(
    caplog: pytest.LogCaptureFixture,
) -> None:
    crashed: list[BaseException] = []
    done = threading.Event()

    def ingest() -> None:
        raise RuntimeError("replay add failed")

    def on_crash(exc: BaseException) -> None:
        crashed.append(exc)
        done.set()

    with caplog.at_level(logging.CRITICAL, logger="zmqrl.runtime.guard"):
        thread = start_guarded(ingest, "ingest", on_crash)
        assert done.wait(10)
        thread.join(10)
    assert thread.daemon and not thread.is_alive()
    assert len(crashed) == 1 and isinstance(crashed[0], RuntimeError)
    assert str(crashed[0]) == "replay add failed"
    text = caplog.text
    assert "thread 'ingest' died" in text and "Traceback (most recent call last)" in text
    assert "in ingest" in text and "RuntimeError: replay add failed" in text


def test_a_guarded_thread_that_returns_normally_calls_nothing() -> None:
    crashed: list[BaseException] = []
    thread = start_guarded(lambda: None, "quiet", crashed.append)
    thread.join(10)
    assert crashed == []


# A process main whose main thread never notices a dead thread: the backstop ends it. The grace is
# cut to 0.2 s here (10 s in a role); the main thread would otherwise wait a minute.
HALF_ALIVE = """
import logging, sys, threading
from zmqrl.runtime import guard
logging.basicConfig(stream=sys.stderr, level=logging.INFO)
guard.CRASH_GRACE_SECONDS = 0.2
guard.install_process_guard()
def ingest():
    raise RuntimeError("replay add failed")
if sys.argv[1] == "guarded":
    guard.start_guarded(ingest, "ingest", on_crash=lambda exc: None)  # an owner that does nothing
else:
    threading.Thread(target=ingest, name="ingest").start()
threading.Event().wait(60)
print("still running")
"""


@pytest.mark.parametrize("started", ["guarded", "plain"])
def test_a_process_whose_main_thread_misses_a_dead_thread_exits_with_its_traceback(started: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", HALF_ALIVE, started], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == EXIT_THREAD_DIED and "still running" not in done.stdout
    assert "thread 'ingest' died" in done.stderr and "RuntimeError: replay add failed" in done.stderr
    assert "did not exit in 0 s: exiting" in done.stderr


# ---------------------------------------------------------------------- a long final checkpoint is progress
def never_crashes(exc: BaseException) -> None:
    raise AssertionError(f"no background write expected: {exc}")


def test_a_final_checkpoint_written_with_a_tick_reports_progress_while_it_takes_its_time(
    tmp_path: Path,
) -> None:
    """Item 3: the final checkpoint (replay snapshot included) is written before the learner exits;
    when it takes longer than progress_timeout, ticks keep the supervisor from calling it hung."""
    ticks: list[float] = []
    # The write's duration is the scenario (elapsed time is what is tested): 1.2 s, longer than
    # two of the ticks the waiting caller makes (every TICK_SECONDS, 0.5 s).
    writer = CheckpointWriter(
        tmp_path / "ckpt", keep=2, on_crash=never_crashes, before_write=lambda: time.sleep(1.2)
    )
    writer.write_now(10, {"counters": {"updates": 10}}, None, 0, tick=lambda: ticks.append(time.monotonic()))
    assert (tmp_path / "ckpt" / "latest").is_file()
    assert len(ticks) >= 3, ticks
    assert max(b - a for a, b in itertools.pairwise(ticks)) < 1.0


def test_a_final_checkpoint_that_fails_raises_on_the_callers_thread(tmp_path: Path) -> None:
    def full_disk() -> None:
        raise OSError("no space left on device")

    writer = CheckpointWriter(tmp_path / "ckpt", keep=2, on_crash=never_crashes, before_write=full_disk)
    with pytest.raises(OSError, match="no space left"):
        writer.write_now(10, {"counters": {}}, None, 0, tick=lambda: None)
