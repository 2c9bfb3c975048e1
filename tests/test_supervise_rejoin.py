"""A watch-only supervisor SIGKILLed mid-run and started again, with a tracker configured that is
slow to open (issue 37, item 4): the roles are still there, it takes them back, training goes on.

The tracker is an MLflow tracking server that accepts connections and never answers (a listening
socket nobody accepts on), with MLflow's request timeout at a few seconds: the supervisor's start
sits that long in opening its MLflow run, as one against a real server that is down does (up to
~36 s with zmqrl's defaults). The roles run without the tracker (their logging is their own).
Before the fix, the supervisor opened it before its heartbeat, and the roles left 3 s into the
silence, with exit 0, which no restart policy restarts.

Real processes, about half a minute: heavy (pytest -m heavy). The parts, fast: tests/
test_supervisor_restart.py (the heartbeat before the tracker, restart counts carried) and
tests/test_rejoin_grace.py (the roles' grace).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import run_state
from tests.conftest import processes_mentioning
from tests.test_supervise import Proc, fixed_ports
from zmqrl.supervisor.snapshot import RunSnapshot

pytestmark = [pytest.mark.slow, pytest.mark.heavy]
# Seconds MLflow waits for the tracker's answer: longer than supervisor.heartbeat_timeout (3 s).
TRACKER_TIMEOUT_S = 6


@pytest.fixture
def silent_tracker() -> Iterator[str]:
    """The URI of an HTTP server that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        sock.close()


@pytest.fixture
def procs() -> Iterator[list[Proc]]:
    started: list[Proc] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                p.proc.kill()
            p.proc.wait()


def supervisor(overrides: list[str], tracker: str) -> Proc:
    tracked = [*overrides, "logging.backends=[tensorboard, mlflow]", f"logging.mlflow_tracking_uri={tracker}"]
    os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] = str(TRACKER_TIMEOUT_S)
    os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] = "0"
    try:
        return Proc(["supervise"], tracked, supervised=False)
    finally:
        del os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"], os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"]


def test_a_supervisor_sigkilled_and_started_again_takes_its_running_roles_back(
    run_root: Path, procs: list[Proc], silent_tracker: str
) -> None:
    run_dir = run_root / "t"
    overrides = [*fixed_ports(run_root), "learner.max_updates=1000000", "supervisor.join_timeout=120"]
    first = supervisor(overrides, silent_tracker)
    procs.append(first)
    learner = Proc(["learner"], overrides, supervised=True)
    actor = Proc(["actor", "--id", "0"], overrides, supervised=True)
    procs.extend([learner, actor])
    run_state.wait_for_snapshot(run_dir, lambda snap: snap.updates > 0, 120, "the learner to train")

    os.kill(first.proc.pid, signal.SIGKILL)  # no stop broadcast, no summary: gone
    first.wait(30)
    second = supervisor(overrides, silent_tracker)
    procs.append(second)
    # Its heartbeat starts before the tracker opens; meanwhile the roles beat on through the silence.

    def both_heard(snap: RunSnapshot) -> bool:
        for role in (learner, actor):
            assert role.proc.poll() is None, f"a role left with its supervisor:\n{role.output}"
        return {r.name for r in snap.processes if run_state.is_up(r)} >= {"learner-0", "actor-0"}

    snap = run_state.wait_for_snapshot(
        run_dir, both_heard, 120, "the restarted supervisor to hear both roles"
    )
    updates_back = snap.updates
    assert learner.proc.poll() is None and actor.proc.poll() is None, [learner.output, actor.output]
    rows = {r.name: r for r in snap.processes}
    assert rows["learner-0"].pid == learner.proc.pid and rows["actor-0"].pid == actor.proc.pid
    assert all(r.restarts == 0 for r in rows.values()), "taken back, not restarted"
    # Training goes on under the new supervisor.
    run_state.wait_for_snapshot(run_dir, lambda s: s.updates > updates_back + 50, 60, "training to go on")
    assert "learner-0 rejoined" in second.output and "actor-0 rejoined" in second.output, second.output

    second.proc.send_signal(signal.SIGTERM)  # `docker compose stop`: a clean end, exit 0
    assert second.wait(60) == 0, second.output
    assert learner.wait(60) == 0 and actor.wait(60) == 0, [learner.output, actor.output]
    assert "cannot write mlflow metrics" in second.output, "the tracker really was slow and failed"
    assert processes_mentioning(str(run_root)) == []
