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

from tests import run_state
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
    overrides = [*fixed_ports(run_root), "learner.max_updates=10000", "actor.num_actors=2"]
    supervisor = Proc(["supervise"], overrides, supervised=False)
    procs.append(supervisor)
    learner = Proc(["learner"], overrides, supervised=True)
    actors = [Proc(["actor", "--id", "auto"], overrides, supervised=True) for _ in range(2)]
    procs.extend([learner, *actors])
    run_dir = run_root / "t"
    for name in ("learner-0", "actor-0", "actor-1"):  # heard from: each announced itself
        run_state.wait_for_process_row(
            run_dir, name, lambda row: row.pid is not None, 60, "to announce itself"
        )
    run_state.wait_for_snapshot(run_dir, lambda snap: snap.updates > 0, 60, "the learner to train")

    stopped = actors[1].proc.pid
    # --id auto: which id this process claimed is its own business; find its row by pid.
    snap = run_state.snapshot(run_dir)
    assert snap is not None
    name = next(row.name for row in snap.processes if row.pid == stopped)
    os.kill(stopped, signal.SIGSTOP)  # it cannot be restarted from here: only reported
    row = run_state.wait_for_process_row(
        run_dir,
        name,
        lambda row: row.pid == stopped and row.state == "down",
        15,
        "judged down",
        alive=lambda: supervisor.proc.poll() is None,
    )
    os.kill(stopped, signal.SIGCONT)
    # Back up in the snapshot, unless the learner ended the run first (10000 updates: ~12 s here, and
    # long enough that a fast, loaded CI machine cannot end the run before the 3 s verdict): the
    # recovery is then checked in the supervisor's report below ("is healthy again").

    def back_up_or_run_over() -> bool:
        row = run_state.process(run_dir, name)
        up = row is not None and row.pid == stopped and run_state.is_up(row)
        return up or supervisor.proc.poll() is not None

    try:
        wait_until(back_up_or_run_over, 15, f"{name} back up (or the run over)")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; {run_state.process(run_dir, name)}\n{supervisor.output}") from None
    assert row.restarts == 0, "a watch-only supervisor restarts nothing"

    assert supervisor.wait(120) == 0, supervisor.output
    assert learner.wait(30) == 0 and all(a.wait(30) == 0 for a in actors), [p.output for p in procs]
    out = supervisor.output
    assert "learner finished; stopping actors" in out and "== learner ==" in out
    assert out.count("cannot restart it") == 1, "a verdict is reported once, not on every loop"
    assert "is healthy again" in out, "the operator is told of the recovery"
    stats = json.loads((run_root / "t" / "stats.json").read_text())
    assert stats["learner"]["updates"] == 10000
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


def test_supervise_stops_on_sigterm_with_exit_0_and_its_summary(run_root: Path, procs: list[Proc]) -> None:
    """`docker compose stop` (a pod's end, `systemctl stop`) asks the supervisor to stop with SIGTERM:
    a requested, clean end, so exit 0 (compose's `restart: on-failure` leaves it stopped), with the
    summary written; `zmqrl status` then says how the run ended, and exits 0 too."""
    supervisor = Proc(["supervise"], fixed_ports(run_root), supervised=False)
    procs.append(supervisor)
    run_state.wait_for_snapshot(run_root / "t", lambda snap: True, 30, "the supervisor to answer")
    supervisor.proc.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, supervisor.output
    assert "SIGTERM received" in supervisor.output
    assert "run stopped on request (SIGTERM, exit code 0)" in supervisor.output
    ask = subprocess.run(
        [sys.executable, "-m", "zmqrl", "status", str(run_root / "t")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ask.returncode == 0, ask.stdout + ask.stderr
    assert f"run {run_root / 't'} ended at " in ask.stdout and "stopped on request (SIGTERM" in ask.stdout


def test_supervise_with_a_run_token_drops_a_forged_learner_finished_and_random_ids(
    run_root: Path, procs: list[Proc], tmp_path: Path
) -> None:
    """One forged heartbeat used to end a watch-only run, and random ids made new slots. With the
    compose setup (a token file the supervisor makes on the shared volume), a peer without the token
    reaches nothing: every message is counted and dropped, and the run goes on."""
    import zmq

    from zmqrl.transport import wire
    from zmqrl.transport.control_auth import HEARTBEAT, ControlAuth
    from zmqrl.transport.control_keys import KeySource
    from zmqrl.transport.wire import HeartbeatMsg

    token = tmp_path / "shared" / "control.token"
    overrides = [*fixed_ports(run_root), f"transport.control_token_file={token}"]
    supervisor = Proc(["supervise"], overrides, supervised=False)
    procs.append(supervisor)
    run_state.wait_for_snapshot(run_root / "t", lambda snap: True, 60, "the supervisor to answer")
    assert token.is_file() and (token.stat().st_mode & 0o077) == 0, "made private for the roles"
    heartbeat = next(o.split("=", 1)[1] for o in overrides if o.startswith("transport.heartbeat="))
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 30_000)  # every message delivered (term returns once they are)
    push.connect(heartbeat)
    forged = [HeartbeatMsg("learner", 0, 4242, 0.0, "finished", {"progress": 1}, {})]
    forged += [HeartbeatMsg("actor", 1000 + i, 5000 + i, 0.0, "running", {}, {}) for i in range(200)]
    for msg in forged:
        push.send_multipart(wire.dump(msg))
    # Then one with the token, on the same connection, which keeps its order: once it is heard, every
    # forged one before it was received and counted, however loaded the machine.
    marker = HeartbeatMsg("evaluator", 0, 4243, 0.0, "running", {"progress": 1}, {"start": "e" * 16})
    sealed = ControlAuth(KeySource(None, token, role="evaluator")).seal(wire.dump(marker), HEARTBEAT)
    assert sealed is not None
    push.send_multipart(sealed)
    push.close()
    ctx.term()
    wait_until(lambda: "evaluator-0 joined" in supervisor.output, 30, "the authenticated marker heard")
    supervisor.proc.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, supervisor.output
    out = supervisor.output
    assert "learner finished" not in out and "joined" not in out.replace("evaluator-0 joined", ""), out
    assert "requires the run's control token" in out
    stats = json.loads((run_root / "t" / "stats.json").read_text())
    assert stats["supervisor"]["unauthenticated_heartbeats"] == len(forged)
    assert stats["actors"] == [] and stats["supervisor"]["dropped_heartbeats"] == 0


def test_supervise_resume_watches_a_finished_run_again(run_root: Path, procs: list[Proc]) -> None:
    """Without --resume a finished run is refused (tests/test_supervise_restarts.py); with it the
    run is watched again (its roles continue it) and its summary is this run's at the end."""
    run_dir = run_root / "t"
    run_dir.mkdir(parents=True)
    (run_dir / "stats.json").write_text(json.dumps({"outcome": "finished", "actors": []}))
    refused = Proc(["supervise"], fixed_ports(run_root), supervised=False)
    procs.append(refused)
    assert refused.wait(60) == 2, refused.output
    assert "zmqrl supervise --resume" in refused.output
    supervisor = Proc(["supervise", "--resume"], fixed_ports(run_root), supervised=False)
    procs.append(supervisor)
    run_state.wait_for_snapshot(run_dir, lambda snap: True, 30, "the supervisor to answer")
    supervisor.proc.send_signal(signal.SIGTERM)
    assert supervisor.wait(30) == 0, supervisor.output
    assert json.loads((run_dir / "stats.json").read_text())["outcome"].startswith("stopped on request")
