"""The launch supervisor without real roles: its judgement and its restart decisions driven by a
fake clock and fake processes (the policy alone: tests/test_restarts.py), how it starts children,
and the parent-death signal a child asks for itself (issue 9, items 9 and 17; issue 23, items 3,
6 and 11)."""

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
from zmqrl.runtime.link import END_ACTORS_DONE, PARENT_PID_ENV, SUPERVISED_ENV
from zmqrl.supervisor import launch as supervisor_module
from zmqrl.supervisor import processes
from zmqrl.supervisor.launch import Supervisor
from zmqrl.supervisor.oversight import EXIT_FAILED, EXIT_OK, EXIT_OPERATOR
from zmqrl.transport.wire import HeartbeatMsg


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


class FakeBeacon:
    """Records what the supervisor hands the control thread."""

    def __init__(self) -> None:
        self.ends: list[str] = []
        self.stops: list[str] = []

    def request_end(self, reason: str) -> None:
        self.ends.append(reason)

    def stop(self, reason: str) -> None:
        self.stops.append(reason)


STOPPED_PIDS: set[int] = set()  # fakes the test has "SIGSTOPped"


@pytest.fixture
def supervisor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Supervisor, Clock, io.StringIO]:
    monkeypatch.setattr(supervisor_module.subprocess, "Popen", FakeProc)
    monkeypatch.setattr(supervisor_module, "os_stopped", lambda pid: pid in STOPPED_PIDS)
    # Never signal a real process group with a fake's pid.
    monkeypatch.setattr(supervisor_module, "signal_tree", lambda proc, signum=9: proc.kill())
    monkeypatch.setattr(supervisor_module, "reap", lambda proc: proc.poll())
    FakeProc.started = []
    STOPPED_PIDS.clear()
    clock, out = Clock(), io.StringIO()
    sup = Supervisor(tiny_config(tmp_path), out=out, clock=clock)
    sup.launched, sup._t0 = time.time(), clock.now
    sup.beacon = FakeBeacon()  # type: ignore[assignment]
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


def run_working(sup: Supervisor, clock: Clock, name: str, seconds: float, working: bool = True) -> None:
    """The process in slot ``name`` beats for ``seconds``, ticking, and working while ``working``."""
    slot, proc = sup.slots[name], sup.procs[name]
    for n in range(1, int(seconds / 0.5) + 1):
        clock.now += 0.5
        counters = {"progress": n, "work": n if working else 0}
        slot.live.heard(HeartbeatMsg(slot.role, slot.id, proc.pid, 0.0, "running", counters, {}), clock.now)
        assert sup._check(slot, clock.now)


def ends(sup: Supervisor, clock: Clock, name: str, code: int) -> bool:
    """The process in slot ``name`` exits with ``code``; returns what the supervisor's check says."""
    sup.procs[name].returncode = code
    clock.now += 0.1
    return sup._check(sup.slots[name], clock.now)


def restart_after_backoff(sup: Supervisor, clock: Clock, name: str) -> float:
    """Let the backoff pass; returns how long it was."""
    slot = sup.slots[name]
    assert slot.restart_at is not None
    delay = slot.restart_at - clock.now
    clock.now = slot.restart_at
    assert sup._check(slot, clock.now)
    assert sup.slots[name] is not slot, "a new slot record for the replacement"
    return delay


def test_an_actor_killed_from_outside_while_working_is_replaced_every_time_at_the_base_delay(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """The chaos behaviour at the shipped defaults: 12 kills of a working actor (each far from
    healthy_seconds, which is minutes) are 12 replacements, none delayed, none counted."""
    sup, clock, out = supervisor
    sup._spawn("actor", 0)
    delays = []
    for _ in range(12):
        run_working(sup, clock, "actor-0", seconds=3.0)
        assert ends(sup, clock, "actor-0", -9)  # SIGKILLed from outside
        delays.append(restart_after_backoff(sup, clock, "actor-0"))
    assert delays == pytest.approx([sup.cfg.supervisor.restart_backoff] * 12)
    assert sup.slots["actor-0"].restarts == 12 and sup.slots["actor-0"].crashes.counted == []
    assert "degraded" not in out.getvalue()
    assert (
        out.getvalue().count("killed by SIGKILL from outside (after useful work); restarting it in 0.5 s")
        == 12
    )


def test_an_actor_stopped_from_outside_is_killed_and_replaced_at_the_base_delay(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, out = supervisor
    sup._spawn("actor", 0)
    for _ in range(8):
        run_working(sup, clock, "actor-0", seconds=3.0)
        STOPPED_PIDS.add(sup.procs["actor-0"].pid)  # SIGSTOP: its beats stop, the OS says "stopped"
        slot = sup.slots["actor-0"]
        while slot.restart_at is None:
            clock.now += 0.1
            assert sup._check(slot, clock.now)
        assert slot.restart_at - clock.now == pytest.approx(sup.cfg.supervisor.restart_backoff)
        restart_after_backoff(sup, clock, "actor-0")
    assert "stopped from outside" in out.getvalue() and "degraded" not in out.getvalue()
    assert sup.slots["actor-0"].crashes.counted == []


def test_an_actor_that_crashes_after_three_seconds_every_time_is_given_up_with_a_growing_backoff(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """Item 3, as found: an env that raises 3 s after every start. Each run does useful work for
    3 s, far from a healthy run, so the backoff doubles and the cap gives the slot up."""
    sup, clock, out = supervisor
    scfg = sup.cfg.supervisor
    (sup.run_dir / "logs" / "actor-0.log").write_text(
        "Traceback (most recent call last):\n  File x\nRuntimeError: env exploded 3 s after start\n"
    )
    sup._spawn("actor", 0)
    delays = []
    for _ in range(50):
        run_working(sup, clock, "actor-0", seconds=3.0)
        if not ends(sup, clock, "actor-0", 1):
            break
        delays.append(restart_after_backoff(sup, clock, "actor-0"))
    assert delays == pytest.approx([0.5, 1.0, 2.0, 4.0, 8.0][: scfg.max_restarts])
    slot = sup.slots["actor-0"]
    assert slot.retired and slot.end == "given up" and slot.restarts == scfg.max_restarts
    lines = [line for line in out.getvalue().splitlines() if "crash loop" in line]
    assert len(lines) == 1, out.getvalue()
    assert f"actor-0 failed {scfg.max_restarts + 1} times in" in lines[0]
    assert "RuntimeError: env exploded 3 s after start" in lines[0]
    assert "the run goes on without it (degraded)" in lines[0]


def test_a_crash_loop_of_minute_long_runs_is_capped_too(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """Whatever each run's length, short of a healthy run (healthy_seconds of work)."""
    sup, clock, _ = supervisor
    sup._spawn("actor", 0)
    for _ in range(50):
        run_working(sup, clock, "actor-0", seconds=60.0)
        if not ends(sup, clock, "actor-0", 1):
            break
        restart_after_backoff(sup, clock, "actor-0")
    assert sup.slots["actor-0"].retired
    assert sup.slots["actor-0"].restarts == sup.cfg.supervisor.max_restarts


def test_a_healthy_run_resets_the_backoff_and_the_count(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, _ = supervisor
    scfg = sup.cfg.supervisor
    sup._spawn("actor", 0)
    for _ in range(3):  # three quick crashes: the backoff grows
        run_working(sup, clock, "actor-0", seconds=1.0)
        assert ends(sup, clock, "actor-0", 1)
        restart_after_backoff(sup, clock, "actor-0")
    assert len(sup.slots["actor-0"].crashes.counted) == 3
    run_working(sup, clock, "actor-0", seconds=scfg.healthy_seconds + 1.0)
    assert ends(sup, clock, "actor-0", 1)
    assert restart_after_backoff(sup, clock, "actor-0") == pytest.approx(scfg.restart_backoff)
    assert sup.slots["actor-0"].crashes.counted == []


def test_an_actor_killed_at_every_start_before_it_did_any_work_is_a_crash_loop(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """An OOM kill at every start is SIGKILL from outside too; before any useful work it counts."""
    sup, clock, out = supervisor
    sup._spawn("actor", 0)
    for _ in range(50):
        run_working(sup, clock, "actor-0", seconds=1.0, working=False)  # starting, waiting for weights
        if not ends(sup, clock, "actor-0", -9):
            break
        restart_after_backoff(sup, clock, "actor-0")
    assert sup.slots["actor-0"].retired
    assert "killed by SIGKILL from outside (before doing useful work" in out.getvalue()


def test_a_role_that_needs_the_operator_is_given_up_at_once_with_its_reason(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """Exit 2 (a refused resume, a full disk, a setting that cannot work): no restart can help."""
    sup, clock, out = supervisor
    (sup.run_dir / "logs" / "actor-0.log").write_text(
        "some output\nerror: no space left on device in runs/t\n"
    )
    sup._spawn("actor", 0)
    run_working(sup, clock, "actor-0", seconds=3.0)
    assert not ends(sup, clock, "actor-0", 2)
    slot = sup.slots["actor-0"]
    assert slot.retired and slot.restarts == 0 and len(FakeProc.started) == 1
    lines = [line for line in out.getvalue().splitlines() if "restarting it" in line or "degraded" in line]
    assert len(lines) == 1, out.getvalue()
    assert "actor-0 exited with code 2, which restarting cannot fix" in lines[0]
    assert "error: no space left on device in runs/t" in lines[0]


def test_a_learner_that_needs_the_operator_ends_the_run_with_exit_2(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, out = supervisor
    sup._spawn("learner", 0)
    run_working(sup, clock, "learner-0", seconds=3.0)
    assert not ends(sup, clock, "learner-0", 2)
    assert "zmqrl launch --resume" in out.getvalue()
    assert sup.slots["learner-0"].exit_code == 2  # _monitor turns this into EXIT_OPERATOR
    assert EXIT_OPERATOR == 2


def test_a_learner_sigtermed_from_outside_is_restarted_not_taken_for_finished(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """Item 6: it stops cleanly on the signal and exits 128 + 15; that is no finished run."""
    sup, clock, out = supervisor
    sup._spawn("learner", 0)
    run_working(sup, clock, "learner-0", seconds=3.0)
    assert ends(sup, clock, "learner-0", 143)
    assert "learner-0 killed by SIGTERM from outside" in out.getvalue()
    assert "restarting it from its latest checkpoint in 0.5 s" in out.getvalue()
    restart_after_backoff(sup, clock, "learner-0")
    assert len(FakeProc.started) == 2 and "finished" not in out.getvalue()


def test_an_actor_sigtermed_from_outside_is_replaced_not_retired(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, _out = supervisor
    sup._spawn("actor", 0)
    run_working(sup, clock, "actor-0", seconds=3.0)
    assert ends(sup, clock, "actor-0", 143)
    assert not sup.slots["actor-0"].retired
    restart_after_backoff(sup, clock, "actor-0")
    assert len(FakeProc.started) == 2


def test_only_its_own_end_or_a_requested_stop_retires_an_actor(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, out = supervisor
    sup._spawn("actor", 0)
    run_working(sup, clock, "actor-0", seconds=3.0)
    slot = sup.slots["actor-0"]
    slot.live.heard(HeartbeatMsg("actor", 0, sup.procs["actor-0"].pid, 0.0, "finished", {}, {}), clock.now)
    assert ends(sup, clock, "actor-0", 0)
    assert slot.retired and slot.end == "finished" and "actor-0 finished" in out.getvalue()


def test_a_hung_actor_that_its_watchdog_ended_counts_towards_the_cap(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, out = supervisor
    sup._spawn("actor", 0)
    run_working(sup, clock, "actor-0", seconds=3.0)
    assert ends(sup, clock, "actor-0", 3)
    assert "exited with code 3 (hung: its watchdog ended it)" in out.getvalue()
    assert len(sup.slots["actor-0"].crashes.counted) == 1


def test_when_every_actor_is_given_up_the_run_ends_with_one_line_naming_them(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    sup, clock, out = supervisor
    (sup.run_dir / "logs" / "actor-0.log").write_text(
        "error: unknown key 'actor.typo' in runs/t/config.yaml\n"
    )
    sup._spawn("learner", 0)
    sup._spawn("actor", 0)
    assert not ends(sup, clock, "actor-0", 2)
    assert sup._every_actor_retired() == EXIT_OPERATOR
    line = [x for x in out.getvalue().splitlines() if "every actor was given up" in x]
    assert len(line) == 1
    assert "actor-0: given up after 0 restart(s), exit code 2" in line[0]
    assert "last error: error: unknown key 'actor.typo'" in line[0]
    assert sup.failure == "every actor was given up"


def test_once_every_actor_reached_max_steps_the_learner_is_asked_to_end_the_run(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """Item 11: with a replay ratio the learner would wait forever for data no actor will send."""
    sup, clock, out = supervisor
    sup._spawn("learner", 0)
    sup._spawn("actor", 0)
    run_working(sup, clock, "actor-0", seconds=1.0)
    sup.slots["actor-0"].live.heard(
        HeartbeatMsg("actor", 0, sup.procs["actor-0"].pid, 0.0, "finished", {}, {}), clock.now
    )
    assert sup._every_actor_retired() is None
    assert sup.beacon.ends == []  # type: ignore[attr-defined]
    assert ends(sup, clock, "actor-0", 0)
    assert sup._every_actor_retired() is None and sup._every_actor_retired() is None
    assert sup.beacon.ends == [END_ACTORS_DONE]  # type: ignore[attr-defined]
    assert "every actor is done (actor.max_steps)" in out.getvalue()


def test_actors_that_stopped_on_the_learners_end_are_no_failure(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """They heard the learner's "finished" before the learner itself exited."""
    sup, clock, out = supervisor
    sup._spawn("learner", 0)
    sup._spawn("actor", 0)
    run_working(sup, clock, "actor-0", seconds=1.0)
    sup.slots["actor-0"].live.heard(
        HeartbeatMsg("actor", 0, sup.procs["actor-0"].pid, 0.0, "stopped", {}, {}), clock.now
    )
    assert ends(sup, clock, "actor-0", 0)
    assert sup._every_actor_retired() is None
    assert "given up" not in out.getvalue() and sup.beacon.ends == []  # type: ignore[attr-defined]


@pytest.mark.parametrize(("reason", "said"), [("learner finished", False), ("stop broadcast", True)])
def test_an_actor_that_left_on_the_learners_end_adds_no_line_before_the_learners_own(
    supervisor: tuple[Supervisor, Clock, io.StringIO], reason: str, said: bool
) -> None:
    """It heard the end on the weights channel a moment before the supervisor heard the learner's
    last heartbeat: "actor-0 stopped" then came just before "learner finished; stopping actors"."""
    sup, clock, out = supervisor
    sup._spawn("learner", 0)
    sup._spawn("actor", 0)
    run_working(sup, clock, "actor-0", seconds=1.0)
    final = HeartbeatMsg("actor", 0, sup.procs["actor-0"].pid, 0.0, "stopped", {}, {"stop_reason": reason})
    sup.slots["actor-0"].live.heard(final, clock.now)
    assert ends(sup, clock, "actor-0", 0)
    assert ("actor-0 stopped" in out.getvalue()) is said, out.getvalue()


@pytest.mark.parametrize(("state", "code"), [("finished", EXIT_OK), ("stopped", EXIT_FAILED)])
def test_a_learner_that_exits_0_finished_the_run_only_if_it_says_so(
    supervisor: tuple[Supervisor, Clock, io.StringIO], state: str, code: int
) -> None:
    sup, clock, out = supervisor
    sup._spawn("learner", 0)
    learner = sup.slots["learner-0"]
    learner.live.heard(HeartbeatMsg("learner", 0, sup.procs["learner-0"].pid, 0.0, state, {}, {}), clock.now)
    assert sup._learner_ended(learner) == code
    assert learner.end == state
    assert ("learner finished; stopping actors" in out.getvalue()) is (state == "finished")


def test_a_learner_that_exits_0_is_never_restarted_even_if_it_was_being_killed(
    supervisor: tuple[Supervisor, Clock, io.StringIO],
) -> None:
    """A learner silent at its very end exited 0 just as the kill came: it had finished the run,
    and restarting it resumed a finished run (the launch then never ended)."""
    sup, clock, out = supervisor
    sup._spawn("learner", 0)
    run_working(sup, clock, "learner-0", seconds=4.0)
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
    # The actor's own watchdog would end it at actor_progress_timeout; this is the backstop.
    limit = sup.cfg.supervisor.actor_progress_timeout + sup.cfg.supervisor.heartbeat_timeout
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
    from zmqrl.runtime.link import die_with_parent
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


def seen_by_child(tmp_path: Path, role: str, variable: str) -> str:
    """The value of ``variable`` in the environment ``start_child`` gives a ``role`` ("None": unset)."""
    from zmqrl.supervisor.processes import start_child

    show = [sys.executable, "-c", f"import os; print(os.environ.get({variable!r}))"]
    log_path = tmp_path / f"{role}-{len(list(tmp_path.iterdir()))}.log"
    proc = start_child(show, log_path, 0.0, role)
    assert proc.wait(timeout=30) == 0
    return log_path.read_text().strip()


def test_actors_and_the_evaluator_get_one_blas_thread_unless_the_environment_sets_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def blas_threads(role: str) -> str:
        return seen_by_child(tmp_path, role, "OPENBLAS_NUM_THREADS")

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    assert [blas_threads(r) for r in ("actor", "evaluator", "learner")] == ["1", "1", "None"]
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "4")
    assert blas_threads("actor") == "4"  # the user's own setting wins


def test_on_an_avx512_cpu_actors_get_openblas_avx2_kernels_unless_the_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zmqrl.supervisor import processes

    def coretype(role: str) -> str:
        return seen_by_child(tmp_path, role, "OPENBLAS_CORETYPE")

    monkeypatch.delenv("OPENBLAS_CORETYPE", raising=False)
    monkeypatch.setattr(processes, "has_avx512", lambda: True)
    assert [coretype(r) for r in ("actor", "evaluator", "learner")] == ["Haswell", "Haswell", "None"]
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    assert coretype("actor") == "Zen"  # the user's own setting wins
    monkeypatch.delenv("OPENBLAS_CORETYPE")
    monkeypatch.setattr(processes, "has_avx512", lambda: False)
    assert coretype("actor") == "None"  # a CPU without AVX-512 keeps OpenBLAS's own choice


def test_avx512_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    from zmqrl.supervisor.processes import has_avx512

    with_it, without = tmp_path / "with", tmp_path / "without"
    with_it.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    without.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512_vnni_like\n")
    assert has_avx512(str(with_it)) and not has_avx512(str(without))
    assert not has_avx512(str(tmp_path / "missing"))  # not Linux, or unreadable


def test_children_do_not_inherit_the_supervisors_health_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Item 11: with ZMQRL_HEALTH_FILE inherited, every child rewrote the supervisor's file."""
    from zmqrl.runtime.health import HEALTH_FILE_ENV
    from zmqrl.supervisor.processes import start_child

    monkeypatch.setenv(HEALTH_FILE_ENV, str(tmp_path / "supervisor-health.json"))
    show = [sys.executable, "-c", f"import os; print(os.environ.get({HEALTH_FILE_ENV!r}))"]
    proc = start_child(show, tmp_path / "child.log", 0.0, "actor")
    assert proc.wait(timeout=30) == 0
    assert (tmp_path / "child.log").read_text().strip() == "None"


SPAWNS_A_HELPER = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", sys.argv[1]])
    print("helper started", flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("how", ["killed", "exits"])
def test_nothing_a_child_started_outlives_it(tmp_path: Path, how: str) -> None:
    """Item 11: the supervisor killed only the child's pid, and an env's subprocess lived on. A
    child killed (a verdict, a stop) takes its process group with it; one that exits by itself
    leaves nothing either."""
    from tests.conftest import processes_mentioning
    from zmqrl.supervisor.processes import reap, signal_tree, start_child

    tag = f"{tmp_path}/helper-of-the-child"
    log_path = tmp_path / "child.log"
    proc = start_child([sys.executable, "-c", SPAWNS_A_HELPER, tag], log_path, 0.0, "actor")
    try:
        wait_until(lambda: "helper started" in log_path.read_text(), 30, "the child's helper")
        wait_until(lambda: processes_mentioning(tag), 30, "the helper process")
        if how == "killed":
            signal_tree(proc)
        else:
            os.kill(proc.pid, signal.SIGKILL)  # as if it crashed: only the supervisor can clean up
            wait_until(lambda: reap(proc) is not None, 30, "the child's exit")
        proc.wait(timeout=30)
        wait_until(lambda: not processes_mentioning(tag), 10, "the helper to be gone with the child")
    finally:
        for pid, _ in processes_mentioning(tag):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# ------------------------------------------------------------------------------------ escalation
# A child that ignores the stop broadcast: it leaves at SIGTERM, or (``stubborn``) ignores that too.
DEAF_CHILD = """
import signal, subprocess, sys, threading
if sys.argv[1] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
grandchild = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])
print(grandchild.pid, flush=True)
threading.Event().wait()
"""


def test_shutdown_escalates_to_sigterm_then_sigkill_and_leaves_no_process_of_a_group() -> None:
    """What `zmqrl launch` does to children that do not stop: stop broadcast, SIGTERM after the
    grace, SIGKILL after another; each child's whole process group goes (an env's subprocesses)."""
    procs, grandchildren = {}, []
    for name in ("actor-0", "actor-1"):
        kind = "stubborn" if name == "actor-1" else "polite"
        proc = subprocess.Popen(
            [sys.executable, "-c", DEAF_CHILD, kind], stdout=subprocess.PIPE, start_new_session=True
        )
        assert proc.stdout is not None
        grandchildren.append(int(proc.stdout.readline()))  # its handler is set by now
        procs[name] = proc
    said: list[str] = []
    stops: list[float] = []
    try:
        processes.stop_in_order(
            procs,
            0.3,
            broadcast_stop=lambda: stops.append(time.monotonic()),
            pump=lambda ms: time.sleep(ms / 1000),  # the supervisor's socket poll, here an idle wait
            say=said.append,
            clock=time.monotonic,
        )
    finally:
        for proc in procs.values():
            processes.signal_tree(proc)
            proc.wait()
    assert stops, "the stop was broadcast first"
    assert said == [
        "warning: actor-0 did not stop within 0 s; sending SIGTERM",
        "warning: actor-1 did not stop within 0 s; sending SIGTERM",
        "warning: actor-1 ignored SIGTERM; killing",
    ]
    assert procs["actor-0"].wait() == -signal.SIGTERM and procs["actor-1"].wait() == -signal.SIGKILL
    for pid in grandchildren:
        wait_until(lambda pid=pid: not pid_alive(pid), 10, f"grandchild {pid} to go")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False
