"""The watch-only supervisor counts restarts by each process's start id, not its pid (issue 26, items
6-7): under docker compose every role is pid 1 of its container on the same hostname, and a
container can be back within a heartbeat. Fake roles (heartbeats sent by the test, with the pid
and start id it chooses) and a real Watcher in a thread; `zmqrl status` asked while it runs and
after it ended."""

from __future__ import annotations

import io
import json
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from typer.testing import CliRunner

from tests.conftest import REPO, tiny_config, tiny_overrides, wait_until
from zmqrl.cli.app import app
from zmqrl.runtime.health import START_INFO_KEY
from zmqrl.supervisor.snapshot import ProcessRow
from zmqrl.supervisor.status import StatusRecord, fetch_status
from zmqrl.supervisor.watch import Watcher
from zmqrl.transport import sockets, wire
from zmqrl.transport.control_auth import HEARTBEAT, ControlAuth
from zmqrl.transport.wire import HeartbeatMsg

START_A, START_B, START_C = "a" * 16, "b" * 16, "c" * 16


@dataclass
class Watching:
    watcher: Watcher
    out: io.StringIO
    push: zmq.Socket
    codes: list[int]
    thread: threading.Thread

    def beat(
        self, role: str, rid: int, pid: int, start: str | None, state: str = "running", **counters: float
    ) -> None:
        """One heartbeat as the process (pid, start) in slot role-rid would send it."""
        info = {"host": "container"} | ({START_INFO_KEY: start} if start is not None else {})
        msg = HeartbeatMsg(role, rid, pid, 0.0, state, {"progress": 1, **counters}, info)
        frames = ControlAuth().seal(wire.dump(msg), HEARTBEAT)
        assert frames is not None
        self.push.send_multipart(frames)

    def said(self, text: str) -> bool:
        return text in self.out.getvalue()

    def heard_steps(self, name: str, steps: float) -> bool:
        """Whether the slot's latest heartbeat is the one carrying ``steps`` (a marker)."""
        slot = self.watcher.slots.get(name)
        return slot is not None and slot.last is not None and slot.last.counters.get("steps") == steps

    def end(self, timeout: float = 30) -> int:
        self.thread.join(timeout=timeout)
        assert not self.thread.is_alive(), self.out.getvalue()
        return self.codes[0]


@pytest.fixture
def watching(tmp_path: Path, ctx: zmq.Context) -> Iterator[Watching]:
    cfg = tiny_config(tmp_path, actor__num_actors=2)
    out = io.StringIO()
    watcher = Watcher(cfg, out=out, ctx=ctx, dashboard=False)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(watcher.run()), daemon=True)
    thread.start()
    wait_until(lambda: not watcher.cfg.transport.heartbeat.endswith(":0"), 20, "the watcher to bind")
    push = sockets.heartbeat_push(ctx, watcher.cfg.transport.heartbeat, sockets.SocketLimits())
    try:
        yield Watching(watcher, out, push, codes, thread)
    finally:
        watcher._signal = watcher._signal or signal.SIGTERM  # a failed assertion must not leave it running
        thread.join(timeout=15)
        push.close(linger=0)


def status_row(run_dir: Path, name: str) -> ProcessRow:
    """The row `zmqrl status` (and the dashboard) shows for ``name``."""
    record = StatusRecord.read(run_dir)
    assert record is not None
    snap = fetch_status(record.endpoint, 5.0)
    assert snap is not None
    return next(row for row in snap.processes if row.name == name)


def status_cmd(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(
        app, ["status", *args], env={"COLUMNS": "110", "NO_COLOR": "1", **(env or {})}
    )
    return result.exit_code, result.output


def test_a_restart_with_the_same_pid_and_a_new_start_is_counted_logged_and_summarised(
    watching: Watching,
) -> None:
    w = watching
    run_dir = w.watcher.run_dir
    w.beat("learner", 0, 1, "l" * 16, updates=5)
    w.beat("actor", 0, 1, START_A, steps=1)
    wait_until(lambda: w.said(f"actor-0 joined (pid 1, start {START_A}"), 10, "actor-0 to join")
    # Back within a heartbeat, as pid 1 again: far under supervisor.heartbeat_timeout.
    w.beat("actor", 0, 1, START_B, steps=2)
    wait_until(lambda: w.said("actor-0 restarted by its orchestrator"), 10, "the restart to be logged")
    line = next(x for x in w.out.getvalue().splitlines() if "actor-0 restarted" in x)
    assert f"(new start {START_B}, pid 1 as before, was down " in line, line
    down = float(re.search(r"was down ([\d.]+) s", line).group(1))  # type: ignore[union-attr]
    assert down < w.watcher.cfg.supervisor.heartbeat_timeout
    assert "1 restart(s) of actor-0 so far" in line
    # The replaced start's late words are no restart, and do not count as the slot's heartbeat.
    w.beat("actor", 0, 1, START_A, steps=99)
    w.beat("actor", 0, 1, START_B, steps=3)
    wait_until(lambda: w.heard_steps("actor-0", 3), 10, "the marker beat")
    assert w.watcher.slots["actor-0"].restarts == 1
    row = status_row(run_dir, "actor-0")
    assert (row.restarts, row.start, row.pid) == (1, START_B, 1), "`zmqrl status` and the dashboard show it"
    w.beat("actor", 0, 1, START_C, steps=4)
    wait_until(lambda: w.watcher.slots["actor-0"].restarts == 2, 10, "the second restart")
    assert w.said("2 restart(s) of actor-0 so far")
    # A process that falls silent and comes back with the same start is no restart.
    w.beat("actor", 1, 1, "d" * 16, steps=1)
    w.beat("actor", 1, 1, "d" * 16, steps=2)
    wait_until(lambda: w.heard_steps("actor-1", 2), 10, "actor-1's second beat")
    assert w.watcher.slots["actor-1"].restarts == 0

    w.beat("actor", 0, 1, START_C, "stopped", steps=5)
    w.beat("actor", 1, 1, "d" * 16, "stopped", steps=3)
    w.beat("learner", 0, 1, "l" * 16, "finished", updates=10)
    assert w.end() == 0
    stats = json.loads((run_dir / "stats.json").read_text())
    assert {r["actor_id"]: r["restarts"] for r in stats["actors"]} == {0: 2, 1: 0}
    assert stats["learner"]["restarts"] == 0 and stats["learner"]["end"] == "finished"
    assert [r["end"] for r in stats["actors"]] == ["stopped", "stopped"], "from their final heartbeats"
    # After the run, `zmqrl status` shows when it ended and the summary as printed (exit 0).
    code, out = status_cmd(str(run_dir))
    assert code == 0, out
    assert out.splitlines()[0].startswith(f"run {run_dir} finished at "), out
    assert "== actors ==" in out and "restarts" in out
    assert (run_dir / "summary.txt").read_text().strip() in out


def test_heartbeats_without_a_start_id_fall_back_to_the_pid(watching: Watching) -> None:
    """Roles from before start ids: a new pid is a restart, the same pid the same process."""
    w = watching
    w.beat("actor", 0, 10, None, steps=1)
    w.beat("actor", 0, 10, None, steps=2)
    wait_until(lambda: w.heard_steps("actor-0", 2), 10, "two beats of pid 10")
    assert w.watcher.slots["actor-0"].restarts == 0
    w.beat("actor", 0, 11, None, steps=3)
    wait_until(lambda: w.said("actor-0 restarted by its orchestrator (new process, pid 11, was 10"), 10, "it")
    assert w.watcher.slots["actor-0"].restarts == 1
    # A role with start ids replacing one without: a new process too.
    w.beat("actor", 0, 11, START_A, steps=4)
    wait_until(lambda: w.watcher.slots["actor-0"].restarts == 2, 10, "the upgraded role counted")


def test_the_warning_for_a_silent_role_says_who_must_replace_it(watching: Watching) -> None:
    w = watching
    w.beat("actor", 0, 1, START_A, steps=1)
    wait_until(lambda: w.said("cannot restart it"), 20, "the silent actor reported")
    line = next(x for x in w.out.getvalue().splitlines() if "cannot restart it" in x)
    assert "no heartbeat for" in line and "`zmqrl health`" in line, line
    # Under compose the image's init and the engine replace it: nothing to do by hand (issue 37).
    assert "the image's init ends a role that stopped beating" in line and "so wait" in line, line
    assert "docker restart" not in line, line


def test_sigterm_stops_the_watcher_with_exit_0_and_its_summary(watching: Watching) -> None:
    w = watching
    w.beat("actor", 0, 1, START_A, steps=1)
    wait_until(lambda: w.said("actor-0 joined"), 10, "actor-0 to join")
    w.watcher._signal = signal.SIGTERM  # as the handler records `docker compose stop`'s SIGTERM
    assert w.end() == 0
    stats = json.loads((w.watcher.run_dir / "stats.json").read_text())
    assert stats["outcome"] == "stopped on request (SIGTERM, exit code 0)"
    code, out = status_cmd(str(w.watcher.run_dir), "--json")
    assert code == 0, out
    ended = json.loads(out)
    assert ended["state"] == "finished" and ended["outcome"] == stats["outcome"]
    assert ended["summary"]["actors"][0]["actor_id"] == 0


# ------------------------------------------------------------------ a second `up` on a finished run


def finished_run_dir(root: Path) -> Path:
    run_dir = root / "t"
    run_dir.mkdir(parents=True)
    summary = {"outcome": "finished", "launched": 1_700_000_000.0, "wall_seconds": 60.0, "actors": []}
    (run_dir / "stats.json").write_text(json.dumps(summary))
    return run_dir


def supervise_cmd(run_root: Path, *extra: str) -> Any:
    args = ["supervise", str(REPO / "configs" / "cartpole_dqn.yaml"), *extra]
    for item in tiny_overrides(run_root):
        args += ["--set", item]
    return CliRunner().invoke(app, args)


def test_supervise_refuses_a_finished_run_and_overwrites_nothing(run_root: Path) -> None:
    run_dir = finished_run_dir(run_root)
    before = sorted((p.name, p.read_bytes()) for p in run_dir.iterdir())
    result = supervise_cmd(run_root)
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert f"the run in {run_dir} finished at " in lines[0]
    assert "run.name" in lines[0] and "zmqrl supervise --resume" in lines[0]
    assert sorted((p.name, p.read_bytes()) for p in run_dir.iterdir()) == before
