"""The launch supervisor's restart rules and how it starts children, without real roles: the
restart policy as a pure function of a slot's unhealthy deaths, the supervisor's judgement driven
by a fake clock and fake processes, and the parent-death signal a child asks for itself (issue 9,
items 9 and 17)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_config, wait_until
from zmqrl.config import SupervisorConfig
from zmqrl.roles import supervisor as supervisor_module
from zmqrl.roles.supervisor import Supervisor
from zmqrl.supervision.link import PARENT_PID_ENV, SUPERVISED_ENV
from zmqrl.supervision.liveness import Liveness, RestartPolicy
from zmqrl.transport.wire import HeartbeatMsg


# ---------------------------------------------------------------------- RestartPolicy
def test_a_healthy_death_is_restarted_after_the_base_backoff() -> None:
    policy = RestartPolicy(max_restarts=5, window=300.0, backoff=0.5, backoff_max=30.0)
    assert policy.delay([], now=1000.0) == 0.5  # no unhealthy deaths in a row: the last run was healthy


def test_backoff_doubles_with_each_unhealthy_death_in_a_row_up_to_the_maximum() -> None:
    policy = RestartPolicy(max_restarts=10, window=300.0, backoff=1.0, backoff_max=5.0)
    deaths: list[float] = []
    delays = []
    for now in range(1, 7):
        deaths.append(float(now))
        delay = policy.delay(deaths, float(now))
        assert delay is not None
        delays.append(delay)
    assert delays == [1.0, 2.0, 4.0, 5.0, 5.0, 5.0]


def test_a_crash_loop_stops_once_its_unhealthy_deaths_exceed_the_cap() -> None:
    policy = RestartPolicy(max_restarts=3, window=60.0, backoff=0.5, backoff_max=30.0)
    assert policy.delay([10.0, 20.0, 30.0], now=30.0) is not None  # three restarts are allowed
    assert policy.delay([10.0, 20.0, 30.0, 40.0], now=40.0) is None


def test_unhealthy_deaths_older_than_the_window_are_forgiven() -> None:
    policy = RestartPolicy(max_restarts=3, window=60.0, backoff=0.5, backoff_max=30.0)
    assert policy.delay([10.0, 20.0, 30.0, 85.0], now=85.0) == pytest.approx(1.0)  # 30 and 85 are recent


def test_zero_restarts_allowed_means_a_crash_at_start_is_never_restarted() -> None:
    assert RestartPolicy(0, 60.0, 1.0, 1.0).delay([5.0], now=5.0) is None


# ---------------------------------------------------------------------- Liveness and RestartPolicy together
def beats_for(live: Liveness, start: float, seconds: float, every: float = 0.5) -> float:
    """Heartbeats with growing progress for ``seconds``; returns the clock after them."""
    t, n = start, 0
    while t <= start + seconds:
        n += 1
        live.heard(HeartbeatMsg("actor", 0, 1, 0.0, "running", {"progress": n}, {}), t)
        t += every
    return t


def test_a_healthy_process_killed_ten_times_is_replaced_ten_times_with_the_base_backoff() -> None:
    """Item 17: the old policy counted every restart, so this actor was given up after five."""
    scfg = SupervisorConfig()
    policy = RestartPolicy(
        scfg.max_restarts, scfg.restart_window, scfg.restart_backoff, scfg.restart_backoff_max
    )
    live, now = Liveness(started=0.0), 0.0
    for _ in range(10):
        now = beats_for(live, now + 1.0, seconds=3.0)  # start-up, then 3 s of progress
        assert live.died(now, scfg) is True
        assert policy.delay(live.unhealthy_deaths, now) == scfg.restart_backoff
        live = live.renew(now + scfg.restart_backoff, pid=None)


def test_a_crash_loop_backs_off_and_stops_at_the_cap_even_after_a_healthy_start() -> None:
    scfg = SupervisorConfig()
    policy = RestartPolicy(
        scfg.max_restarts, scfg.restart_window, scfg.restart_backoff, scfg.restart_backoff_max
    )
    live = Liveness(started=0.0)
    now = beats_for(live, 1.0, seconds=10.0)
    live.died(now, scfg)  # healthy: it ran; then every replacement crashes at start
    delays: list[float | None] = []
    while True:
        live = live.renew(now, pid=None)
        now += 0.7
        assert live.died(now, scfg) is False
        delay = policy.delay(live.unhealthy_deaths, now)
        delays.append(delay)
        if delay is None:
            break
        now += delay
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, None]  # max_restarts (5) restarts, then stays down


# ---------------------------------------------------------------------- the supervisor with fake processes
class FakeProc:
    """Stands in for subprocess.Popen: records how it was called; the test decides when it exits."""

    started: list[FakeProc] = []  # noqa: RUF012 (the test's record of every start)
    next_pid = 50_000

    def __init__(self, cmd: list[str], **kwargs: Any) -> None:
        self.cmd, self.kwargs = cmd, kwargs
        FakeProc.next_pid += 1
        self.pid = FakeProc.next_pid
        self.returncode: int | None = None
        FakeProc.started.append(self)

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        assert self.returncode is not None, "the test never waits on a live fake"
        return self.returncode


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Supervisor, Clock, io.StringIO]:
    monkeypatch.setattr(supervisor_module.subprocess, "Popen", FakeProc)
    monkeypatch.setattr(supervisor_module, "os_stopped", lambda pid: False)
    FakeProc.started = []
    clock, out = Clock(), io.StringIO()
    sup = Supervisor(tiny_config(tmp_path), out=out, clock=clock)
    sup.launched, sup._t0 = time.time(), clock.now
    (sup.run_dir / "logs").mkdir(parents=True)
    return sup, clock, out


def test_children_are_started_without_preexec_fn_and_told_their_parent(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """Item 9: a preexec_fn runs Python between fork and exec, unsafe in a parent with threads (the
    ZAP authenticator); each child asks for its parent-death signal itself, from ZMQRL_PARENT_PID."""
    sup, _, _ = supervisor
    sup._spawn("learner", 0)
    sup._spawn("actor", 0)
    assert len(FakeProc.started) == 2
    for proc in FakeProc.started:
        assert proc.kwargs.get("preexec_fn") is None, proc.kwargs
        assert proc.kwargs["start_new_session"] is True  # a terminal's Ctrl-C reaches only the supervisor
        env = proc.kwargs["env"]
        assert env[PARENT_PID_ENV] == str(os.getpid()) and env[SUPERVISED_ENV] == "1"


def run_healthily(sup: Supervisor, clock: Clock, name: str, seconds: float) -> None:
    slot, proc = sup.slots[name], sup.procs[name]
    for n in range(1, int(seconds / 0.5) + 1):
        clock.now += 0.5
        slot.live.heard(HeartbeatMsg("actor", 0, proc.pid, 0.0, "running", {"progress": n}, {}), clock.now)
        assert sup._check(slot, clock.now)


def restart_after_backoff(sup: Supervisor, clock: Clock, name: str) -> float:
    """Let the backoff pass; returns how long it was."""
    slot = sup.slots[name]
    assert slot.restart_at is not None
    delay = slot.restart_at - clock.now
    clock.now = slot.restart_at
    assert sup._check(slot, clock.now)
    assert sup.slots[name] is not slot, "a new slot record for the replacement"
    return delay


def test_the_supervisor_replaces_a_healthy_actor_every_time_it_is_killed(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, out = supervisor
    sup._spawn("actor", 0)
    delays = []
    for _ in range(12):
        run_healthily(sup, clock, "actor-0", seconds=4.0)
        sup.procs["actor-0"].returncode = -9  # SIGKILLed from outside
        assert sup._check(sup.slots["actor-0"], clock.now)
        delays.append(restart_after_backoff(sup, clock, "actor-0"))
    assert delays == [sup.cfg.supervisor.restart_backoff] * 12
    assert sup.slots["actor-0"].restarts == 12
    assert "degraded" not in out.getvalue()
    assert out.getvalue().count("after running healthily; restarting it in 0.5 s") == 12


def test_the_supervisor_gives_up_a_crash_loop_with_one_clear_line(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, out = supervisor
    scfg = sup.cfg.supervisor
    sup._spawn("actor", 0)
    run_healthily(sup, clock, "actor-0", seconds=4.0)
    for _ in range(50):
        slot = sup.slots["actor-0"]
        sup.procs["actor-0"].returncode = 2  # e.g. a config it cannot use: exits at start
        clock.now += 0.3
        if not sup._check(slot, clock.now):  # given up
            break
        restart_after_backoff(sup, clock, "actor-0")
    slot = sup.slots["actor-0"]
    assert slot.retired and slot.restarts == scfg.max_restarts + 1  # the healthy death's, then the cap
    lines = [line for line in out.getvalue().splitlines() if "crash loop" in line]
    assert len(lines) == 1, out.getvalue()
    assert f"exited with code 2, {scfg.max_restarts + 1} times in a row without running healthily" in lines[0]
    assert "the run goes on without it (degraded)" in lines[0]


def test_a_learner_that_exits_0_is_never_restarted_even_if_it_was_being_killed(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """A learner silent at its very end exited 0 just as the kill came: it had finished the run,
    and restarting it resumed a finished run (the launch then never ended)."""
    sup, clock, out = supervisor
    sup._spawn("learner", 0)
    run_healthily(sup, clock, "learner-0", seconds=4.0)
    sup.procs["learner-0"].returncode = 0
    assert sup._check(sup.slots["learner-0"], clock.now)
    assert sup.slots["learner-0"].restart_at is None and len(FakeProc.started) == 1
    assert "restarting" not in out.getvalue()


def test_an_actor_that_beats_but_never_progresses_is_killed_as_hung(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, out = supervisor
    sup._spawn("actor", 0)
    slot, proc = sup.slots["actor-0"], sup.procs["actor-0"]
    limit = sup.cfg.supervisor.progress_timeout
    t0 = clock.now
    while clock.now - t0 < limit + 1.0 and not proc.returncode:
        clock.now += 0.5
        slot.live.heard(HeartbeatMsg("actor", 0, proc.pid, 0.0, "waiting", {"progress": 3}, {}), clock.now)
        sup._check(slot, clock.now)
    assert proc.returncode == -9, out.getvalue()
    assert clock.now - t0 > limit
    assert "alive but no progress for" in out.getvalue() and "killing it" in out.getvalue()


# ---------------------------------------------------------------------- die_with_parent, for real
CHILD = textwrap.dedent(
    """
    import sys, time
    from zmqrl.supervision.link import die_with_parent
    die_with_parent()
    open(sys.argv[1], "w").write("armed")
    time.sleep(120)
    """
)
PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    env = {**os.environ, "ZMQRL_PARENT_PID": str(os.getpid())}
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], env=env,
                             start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(120)
    """
)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_that_asked_to_die_with_its_parent_gets_sigterm_when_the_parent_is_killed(
    tmp_path: Path,
) -> None:
    armed = tmp_path / "armed"
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, CHILD, str(armed)], stdout=subprocess.PIPE, text=True
    )
    child_pid = 0
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        wait_until(armed.is_file, 60, "the child to ask for its parent-death signal")
        parent.kill()  # no chance to clean up: only the kernel can tell the child
        parent.wait(10)
        wait_until(lambda: gone(child_pid), 10, "the orphaned child to die")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child_pid and not gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_child_whose_parent_is_already_gone_leaves_at_once(tmp_path: Path) -> None:
    """The request only covers deaths from now on: a parent that died before it was made leaves the
    child reparented, which die_with_parent notices (its parent is not the one it was told)."""
    armed = tmp_path / "armed"
    env = {**os.environ, PARENT_PID_ENV: "1" if os.getpid() != 1 else "2"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, str(armed)], env=env, timeout=60, capture_output=True
    )
    assert child.returncode == -signal.SIGTERM
    assert not armed.exists()
    assert b"is already gone: exiting" in child.stderr


def test_actors_and_the_evaluator_get_one_blas_thread_unless_the_environment_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zmqrl.supervision.processes import start_child

    show = [sys.executable, "-c", "import os; print(os.environ.get('OPENBLAS_NUM_THREADS'))"]

    def blas_threads(role: str) -> str:
        log_path = tmp_path / f"{role}-{len(list(tmp_path.iterdir()))}.log"
        proc = start_child(show, log_path, 0.0, role)
        assert proc.wait(timeout=30) == 0
        return log_path.read_text().strip()

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert [blas_threads(r) for r in ("actor", "evaluator", "learner")] == ["1", "1", "None"]
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    assert blas_threads("actor") == "4"  # the user's own setting wins
