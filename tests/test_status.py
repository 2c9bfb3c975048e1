"""The supervisor's status channel and `zmqrl status` (issue 11 item 2, and item 1's heartbeat host).

In-process: a status server answering from a thread of its own (the supervisor's loop, here), the
client, bad requests, and every "nothing runs there" answer of the command. For real: a launch
that `zmqrl status RUN_DIR --json` is asked about while it runs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import msgpack
import pytest
import zmq
from typer.testing import CliRunner

from tests.conftest import REPO, tiny_overrides, wait_until
from zmqrl import strictjson
from zmqrl.cli.app import app
from zmqrl.config import ConfigError, load_config
from zmqrl.supervisor.snapshot import ProcessRow, RunSnapshot
from zmqrl.supervisor.status import (
    STATUS_RECORD,
    StatusClient,
    StatusRecord,
    StatusServer,
    fetch_status,
)
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.keys import Security, SecurityError, create_keys
from zmqrl.transport.security import start_authenticator
from zmqrl.transport.sockets import BindError, SocketLimits, status_router


def a_snapshot(n: int = 0) -> RunSnapshot:
    return RunSnapshot(
        run_dir="runs/t",
        state="running",
        elapsed=12.0 + n,
        progress=0.25,
        progress_label="updates 75/300",
        processes=[
            ProcessRow("learner", 0, pid=11, host="h", state="running", rate=60.0, rate_unit="upd/s"),
            ProcessRow("actor", 0, pid=12, host="h", state="running", rate=400.0, rate_unit="steps/s"),
        ],
        updates=75,
        max_updates=300,
    )


class Served:
    """A status server answering from a thread of its own, as the supervisor does from its loop."""

    def __init__(
        self,
        ctx: zmq.Context,
        snapshot: Callable[[], RunSnapshot | None],
        security: Security | None = None,
    ) -> None:
        self.sock, self.endpoint = status_router(ctx, "tcp://127.0.0.1:0", SocketLimits(), security=security)
        self.server = StatusServer(self.sock, snapshot, BadMessages("test status"))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            if self.sock.poll(20):
                self.server.serve()
        self.sock.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.fixture
def served(ctx: zmq.Context) -> Iterator[Served]:
    server = Served(ctx, a_snapshot)
    yield server
    server.close()


def free_endpoint(ctx: zmq.Context) -> str:
    """A loopback endpoint nothing listens on (bound by the OS, then closed)."""
    sock = ctx.socket(zmq.ROUTER)
    sock.bind("tcp://127.0.0.1:0")
    endpoint = str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    sock.close(linger=0)
    return endpoint


# ------------------------------------------------------------------ server and client


def test_the_supervisor_answers_with_its_snapshot(ctx: zmq.Context, served: Served) -> None:
    snap = fetch_status(served.endpoint, 5.0, ctx=ctx)
    assert snap is not None and snap.to_dict() == a_snapshot().to_dict()
    assert served.server.answered == 1


def test_malformed_requests_are_counted_and_answered_and_do_not_stop_the_server(
    ctx: zmq.Context, served: Served
) -> None:
    raw = ctx.socket(zmq.DEALER)
    raw.connect(served.endpoint)
    replies = []
    for frames in (
        [b"", b"\xc1 not msgpack"],
        [b"", msgpack.packb([1, 2])],
        [b"", msgpack.packb({"want": "everything", "id": 7})],
        [b"", msgpack.packb({"want": "status", "id": -1})],
    ):
        raw.send_multipart(frames)
        assert raw.poll(5000), f"no answer to {frames}"
        _, body = raw.recv_multipart()
        replies.append(msgpack.unpackb(body))
    raw.send_multipart([b"no delimiter"])  # nothing to answer to: counted and dropped
    wait_until(lambda: served.server.bad.count == 5, 5, "the fifth bad request counted")
    raw.close(linger=0)
    assert [r["ok"] for r in replies] == [False] * 4
    assert replies[2]["id"] == 7 and "unknown request" in replies[2]["error"]
    assert "not msgpack" in replies[0]["error"]
    snap = fetch_status(served.endpoint, 5.0, ctx=ctx)
    assert snap is not None and snap.processes[0].role == "learner", "still answering"


def test_a_late_answer_to_an_earlier_request_is_not_taken_for_the_next_one(ctx: zmq.Context) -> None:
    calls: list[int] = []
    gave_up = threading.Event()

    def slow_then_fast() -> RunSnapshot:
        calls.append(len(calls))
        if len(calls) == 1:
            gave_up.wait(10)  # the supervisor's loop was busy until the client stopped waiting
        return a_snapshot(len(calls))

    server = Served(ctx, slow_then_fast)
    client = StatusClient(server.endpoint, ctx=ctx)
    try:
        assert client.fetch(0.2) is None
        gave_up.set()  # the first answer goes out now, late
        snap = client.fetch(5.0)
    finally:
        gave_up.set()
        client.close()
        server.close()
    assert snap is not None and snap.elapsed == 12.0 + 2, "the answer to the second request"


def test_nothing_listening_is_no_snapshot_within_the_timeout(ctx: zmq.Context) -> None:
    started = time.monotonic()
    assert fetch_status(free_endpoint(ctx), 0.5, ctx=ctx) is None
    assert time.monotonic() - started < 3.0


def test_the_record_says_where_the_supervisor_answers(tmp_path: Path) -> None:
    record = StatusRecord("tcp://127.0.0.1:4000", pid=42, host="h", command="launch", started=1.0)
    record.write(tmp_path / "run")
    assert StatusRecord.read(tmp_path / "run") == record
    assert StatusRecord.read(tmp_path) is None
    (tmp_path / STATUS_RECORD).write_text("{not json")
    with pytest.raises(Exception, match="cannot read"):
        StatusRecord.read(tmp_path)


def test_a_status_port_in_use_names_its_setting(ctx: zmq.Context, served: Served) -> None:
    with pytest.raises(BindError, match=r"setting supervisor\.status\b.*--set supervisor\.status="):
        status_router(ctx, served.endpoint, SocketLimits())


def test_without_keys_the_status_socket_binds_loopback_only(ctx: zmq.Context) -> None:
    with pytest.raises(SecurityError, match="exposes it beyond this machine"):
        status_router(ctx, "tcp://0.0.0.0:0", SocketLimits())


def test_with_keys_zmqrl_status_asks_with_the_runs_client_key_and_strangers_get_nothing(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    keys = tmp_path / "keys"
    create_keys(keys)
    security = Security.load(keys)
    auth = start_authenticator(security, ctx)
    server = Served(ctx, a_snapshot, security=security)
    try:
        run_dir = tmp_path / "run"
        StatusRecord(
            server.endpoint, pid=os.getpid(), host="h", command="launch", started=1.0, keys_dir=str(keys)
        ).write(run_dir)
        code, out = status_cmd(str(run_dir), "--json")
        assert code == 0, out
        assert json.loads(out)["processes"][0]["role"] == "learner"
        assert fetch_status(server.endpoint, 0.5, ctx=ctx) is None, "plaintext gets no answer"
        public, secret = zmq.curve_keypair()
        stranger = dataclasses.replace(
            security, server_secret=None, client_public=public, client_secret=secret
        )
        assert fetch_status(server.endpoint, 0.5, security=stranger, ctx=ctx) is None
    finally:
        server.close()
        auth.stop()


def test_the_status_endpoint_is_validated() -> None:
    with pytest.raises(ConfigError, match=r"supervisor\.status must be a ZeroMQ endpoint"):
        load_config(None, ["supervisor.status=localhost:5559"])
    with pytest.raises(ConfigError, match=r"supervisor\.status must differ"):
        load_config(None, ["supervisor.status=tcp://127.0.0.1:5557"])  # transport.heartbeat's default


# ------------------------------------------------------------------ the command


def status_cmd(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    base = {"COLUMNS": "110", "NO_COLOR": "1", "ZMQRL_RUN__DIR": None, "ZMQRL_RUN__NAME": None}
    result = CliRunner().invoke(app, ["status", *args], env={**base, **(env or {})})
    return result.exit_code, result.output


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_missing_run_directory_is_one_line_and_exit_1(tmp_path: Path) -> None:
    code, out = status_cmd(str(tmp_path / "runs" / "nope"))
    assert code == 1 and "no run directory" in out and len(out.strip().splitlines()) == 1


def test_a_run_directory_without_a_supervisor_says_how_to_start_one(tmp_path: Path) -> None:
    code, out = status_cmd(str(tmp_path))
    assert code == 1, out
    assert f"no supervisor has run in {tmp_path}" in out and "zmqrl launch CONFIG" in out


def test_a_supervisor_that_does_not_answer_is_reported_within_the_timeout(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    endpoint = free_endpoint(ctx)
    pid = dead_pid()
    StatusRecord(endpoint, pid=pid, host=socket.gethostname(), command="launch", started=1.0).write(tmp_path)
    started = time.monotonic()
    code, out = status_cmd(str(tmp_path), "--timeout", "0.5")
    assert time.monotonic() - started < 10
    assert code == 1, out
    assert f"the run's supervisor (`zmqrl launch`, pid {pid} on host {socket.gethostname()})" in out
    assert f"does not answer on {endpoint}: pid {pid} is not running here" in out
    assert "did not exit cleanly" in out
    assert "logs" not in out, "a compose run has no logs/: named only where it exists"
    (tmp_path / "logs").mkdir()
    code, out = status_cmd(str(tmp_path), "--timeout", "0.5")
    assert code == 1 and f"see {tmp_path / 'logs'}" in out, out


def test_a_supervisor_on_another_host_is_said_to_be_there_not_to_have_exited(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    """`zmqrl status` from the host, on a compose volume: the record names the container's host and
    its loopback endpoint, which no process here answers."""
    endpoint = free_endpoint(ctx)
    StatusRecord(endpoint, pid=1, host="c0ffee123456", command="supervise", started=1.0).write(tmp_path)
    code, out = status_cmd(str(tmp_path), "--timeout", "0.5")
    assert code == 1, out
    assert "it runs on host c0ffee123456" in out and "exited" not in out
    assert "docker compose exec supervisor zmqrl status" in out and "--endpoint ADDR" in out
    assert "logs" not in out


def test_a_finished_run_shows_when_it_ended_and_its_summary(tmp_path: Path) -> None:
    record = StatusRecord("tcp://127.0.0.1:4000", pid=42, host="h", command="supervise", started=1.0)
    record.state, record.ended = "finished", 2.0
    record.write(tmp_path)
    (tmp_path / "stats.json").write_text(json.dumps({"outcome": "finished", "actors": []}))
    (tmp_path / "summary.txt").write_text("== learner ==\nupdates 300\n")
    code, out = status_cmd(str(tmp_path))
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0].startswith(f"run {tmp_path} finished at ") and "`zmqrl supervise` pid 42 on h" in lines[0]
    assert lines[1:] == ["== learner ==", "updates 300"]
    code, out = status_cmd(str(tmp_path), "--watch")
    assert code == 0 and "finished at" in out, "nothing to watch: the same answer"


def test_a_finished_run_without_its_summary_text_shows_the_gist_of_its_stats(tmp_path: Path) -> None:
    record = StatusRecord("tcp://127.0.0.1:4000", pid=42, host="h", command="launch", started=1.0)
    record.state, record.ended = "finished", 2.0
    record.write(tmp_path)
    stats = {
        "outcome": "stopped on request (SIGINT, exit code 130)",
        "learner": {"updates": 7, "samples": 90, "restarts": 1},
        "actors": [{"actor_id": 0, "samples": 90, "restarts": 2, "end": "stopped"}],
    }
    (tmp_path / "stats.json").write_text(json.dumps(stats))
    code, out = status_cmd(str(tmp_path))
    assert code == 0, out
    assert "ended at " in out and "stopped on request (SIGINT" in out
    assert "updates 7" in out and "actor-0: samples 90, restarts 2, end stopped" in out


def test_without_run_dir_the_newest_run_under_zmqrl_run_dir_is_shown(tmp_path: Path) -> None:
    """`docker compose exec supervisor zmqrl status`: the image sets ZMQRL_RUN__DIR=/runs."""
    for name, started in (("old", 1.0), ("new", 5.0)):
        record = StatusRecord("tcp://127.0.0.1:4000", pid=42, host="h", command="supervise", started=started)
        record.state, record.ended = "finished", started + 1
        record.write(tmp_path / name)
    code, out = status_cmd(env={"ZMQRL_RUN__DIR": str(tmp_path)})
    assert code == 0, out
    assert f"run {tmp_path / 'new'} " in out and f"{tmp_path / 'new'}: the newest of 2 runs" in out
    code, out = status_cmd(env={"ZMQRL_RUN__DIR": str(tmp_path), "ZMQRL_RUN__NAME": "old"})
    assert code == 0 and f"run {tmp_path / 'old'} " in out, out


def test_run_dir_or_endpoint_is_required() -> None:
    code, out = status_cmd()
    assert code == 2 and "RUN_DIR" in out


def record_for(served: Served, run_dir: Path) -> StatusRecord:
    record = StatusRecord(served.endpoint, pid=os.getpid(), host="h", command="launch", started=1.0)
    record.write(run_dir)
    return record


def test_json_is_the_snapshot_as_strict_json(tmp_path: Path, served: Served) -> None:
    record_for(served, tmp_path)
    code, out = status_cmd(str(tmp_path), "--json")
    assert code == 0, out
    data = strictjson.loads_strict(out)
    assert [(p["role"], p["pid"]) for p in data["processes"]] == [("learner", 11), ("actor", 12)]
    assert data["eta_seconds"] is None, "not measured: null, never NaN"


def test_the_table_is_the_dashboard(served: Served) -> None:
    code, out = status_cmd("--endpoint", served.endpoint)
    assert code == 0, out
    assert "learner-0" in out and "actor-0" in out and "11@h" in out and "updates 75/300" in out


def test_watch_ends_with_run_finished_when_the_supervisor_leaves(tmp_path: Path, served: Served) -> None:
    record = record_for(served, tmp_path)

    def finish_after_two_answers() -> None:
        wait_until(lambda: served.server.answered >= 2, 20, "two answers")
        served.close()
        record.state, record.ended = "finished", time.time()
        record.write(tmp_path)

    ending = threading.Thread(target=finish_after_two_answers, daemon=True)
    ending.start()
    code, out = status_cmd(str(tmp_path), "--watch", "--json", "--interval", "0.1", "--timeout", "1")
    ending.join(timeout=5)
    assert code == 0, out
    lines = out.strip().splitlines()
    assert lines[-1] == "run finished"
    assert len(lines) >= 3 and all(json.loads(line)["state"] == "running" for line in lines[:-1])


# ------------------------------------------------------------------ for real


@pytest.mark.slow
def test_status_of_a_real_launch_lists_its_learner_and_actors(run_root: Path, ctx: zmq.Context) -> None:
    overrides = tiny_overrides(run_root, learner__max_updates=100_000, actor__num_actors=2)
    cmd = [sys.executable, "-m", "zmqrl", "launch", str(REPO / "configs" / "cartpole_dqn.yaml"), "--plain"]
    for item in overrides:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    launch = subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    run_dir = run_root / "t"
    found: dict[str, dict[str, object]] = {}

    def every_process_running() -> bool:
        if not (run_dir / STATUS_RECORD).is_file() or launch.poll() is not None:
            return launch.poll() is not None  # ends the wait; asserted below
        ask = subprocess.run(
            [sys.executable, "-m", "zmqrl", "status", str(run_dir), "--json"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=30,
        )
        if ask.returncode != 0:
            return False
        rows = json.loads(ask.stdout)["processes"]
        found.clear()
        found.update({f"{r['role']}-{r['id']}": r for r in rows})
        # Under the config's replay ratio an actor may be "blocked": held back, alive and working.
        return len(found) == 3 and all(r["state"] in ("running", "blocked") for r in found.values())

    try:
        wait_until(every_process_running, 60, "learner and 2 actors running, as `zmqrl status` sees them")
        assert launch.poll() is None, launch.communicate()[0]
        assert sorted(found) == ["actor-0", "actor-1", "learner-0"]
        for row in found.values():
            assert isinstance(row["pid"], int) and row["host"] == socket.gethostname()
        record = StatusRecord.read(run_dir)
        assert record is not None and record.pid == launch.pid
        garbage = ctx.socket(zmq.DEALER)
        garbage.connect(record.endpoint)
        garbage.send_multipart([b"", b"\xc1\xc1"])
        assert garbage.poll(5000), "an error reply"
        garbage.close(linger=0)
        assert fetch_status(record.endpoint, 5.0, ctx=ctx) is not None, "the supervisor still answers"
        launch.send_signal(signal.SIGINT)
        out, _ = launch.communicate(timeout=30)
        assert launch.returncode == 130, out
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate()
    assert StatusRecord.read(run_dir).state == "finished"  # type: ignore[union-attr]
    stats = json.loads((run_dir / "stats.json").read_text())
    assert stats["supervisor"]["bad_status_requests"] == 1
    code, said = status_cmd(str(run_dir))
    assert code == 0 and f"run {run_dir} ended at " in said and "stopped on request (SIGINT" in said, said
    assert "== learner ==" in said and "== actors ==" in said
