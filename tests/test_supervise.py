"""`zmqrl supervise`: a supervisor that starts nothing, watching roles started by hand."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import processes_mentioning, tiny_overrides, wait_until

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "cartpole_dqn.yaml"


class Proc:
    """A zmqrl command whose stdout+stderr is collected as it runs."""

    def __init__(self, args: list[str], overrides: list[str], supervised: bool) -> None:
        cmd = [sys.executable, "-m", "zmqrl", *args, str(CONFIG)]
        for item in overrides:
            cmd += ["--set", item]
        env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")}
        env["PYTHONUNBUFFERED"] = "1"
        if supervised:
            env["ZMQRL_SUPERVISED"] = "1"
        self.proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"still running after {timeout} s:\n{self.output}") from None
        self._reader.join(timeout=5)
        return code


def fixed_ports(run_root: Path) -> list[str]:
    """Roles started by hand must agree on endpoints up front: ask the OS for four free ports."""
    import socket

    ports = []
    socks = []
    for _ in range(4):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    names = ("samples", "weights", "heartbeat", "control")
    return [
        *(o for o in tiny_overrides(run_root) if not o.startswith("transport.")),
        *(f"transport.{n}=tcp://127.0.0.1:{p}" for n, p in zip(names, ports, strict=True)),
    ]


@pytest.fixture
def procs() -> list[Proc]:
    started: list[Proc] = []
    yield started
    for p in started:
        if p.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.proc.pid, signal.SIGCONT)
                p.proc.kill()
            p.proc.wait()


def test_supervise_watches_roles_it_did_not_start_reports_a_stopped_one_and_ends_with_the_learner(
    run_root: Path, procs: list[Proc]
) -> None:
    overrides = [*fixed_ports(run_root), "learner.max_updates=2500", "actor.num_actors=2"]
    supervisor = Proc(["supervise"], overrides, supervised=False)
    procs.append(supervisor)
    learner = Proc(["learner"], overrides, supervised=True)
    actors = [Proc(["actor", "--id", "auto"], overrides, supervised=True) for _ in range(2)]
    procs.extend([learner, *actors])
    for name in ("learner-0", "actor-0", "actor-1"):
        wait_until(lambda n=name: f"{n} joined" in supervisor.output, 60, f"{name} to announce itself")
    wait_until(lambda: "training:" in learner.output, 60, "the learner to train")

    os.kill(actors[1].proc.pid, signal.SIGSTOP)  # it cannot be restarted from here: only reported
    wait_until(lambda: "cannot restart it" in supervisor.output, 15, "the stopped actor to be reported")
    os.kill(actors[1].proc.pid, signal.SIGCONT)
    wait_until(lambda: "is healthy again" in supervisor.output, 15, "the actor's recovery to be reported")

    assert supervisor.wait(120) == 0, supervisor.output
    assert learner.wait(30) == 0 and all(a.wait(30) == 0 for a in actors), [p.output for p in procs]
    out = supervisor.output
    assert "learner finished; stopping actors" in out and "== learner ==" in out
    assert out.count("cannot restart it") == 1, "a verdict is reported once, not on every loop"
    stats = json.loads((run_root / "t" / "stats.json").read_text())
    assert stats["learner"]["updates"] == 2500
    assert sorted(r["actor_id"] for r in stats["actors"]) == [0, 1]  # --id auto: distinct ids
    assert processes_mentioning(str(run_root)) == []


def test_a_supervised_role_waits_for_a_late_supervisor_then_leaves_when_none_comes(
    run_root: Path, procs: list[Proc]
) -> None:
    overrides = [*fixed_ports(run_root), "supervisor.join_timeout=4"]
    learner = Proc(["learner"], overrides, supervised=True)
    procs.append(learner)
    assert learner.wait(90) == 0, learner.output
    assert "watching the supervisor at" in learner.output
    assert "no supervisor at" in learner.output and "supervisor.join_timeout" in learner.output


def test_supervise_stops_on_sigterm_with_the_documented_code(run_root: Path, procs: list[Proc]) -> None:
    supervisor = Proc(["supervise"], fixed_ports(run_root), supervised=False)
    procs.append(supervisor)
    wait_until(lambda: "watching run" in supervisor.output, 30, "the supervisor to bind")
    supervisor.proc.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 143, supervisor.output
    assert "SIGTERM received" in supervisor.output
