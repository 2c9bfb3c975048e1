"""Per-role HTTP health (issue 26 item 2): ``/healthz`` gives ``zmqrl health``'s verdict over HTTP,
``/readyz`` whether the role can do its job now; the server a role's link starts and stops. Made-up
health records on a free loopback port, a link driven by hand, and one role process whose port is
taken (it must exit naming the setting)."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.conftest import REPO, tiny_config, tiny_overrides
from zmqrl.config import Config, SupervisorConfig
from zmqrl.config_checks import health_http_problem, parse_http_address
from zmqrl.errors import ConfigError
from zmqrl.runtime import http_probe
from zmqrl.runtime.health import HealthRecord, judge
from zmqrl.runtime.http_probe import (
    HealthServer,
    ProbeView,
    readyz,
    shared_host_problem,
)
from zmqrl.runtime.link import SupervisorLink
from zmqrl.transport.sockets import BindError

CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
LEARNER_INFO = {"samples": "tcp://127.0.0.1:5555", "weights": "tcp://127.0.0.1:5556", "host": "h"}


# When the parametrized cases' records were made (at collection, maybe minutes before their test
# runs in a whole suite): fresh() moves one to now, keeping its ages.
MADE = time.time()


def record(role: str = "actor", *, age: float = 0.1, stuck: float = 0.5, **fields: object) -> HealthRecord:
    """A record written ``age`` seconds ago, whose progress last moved ``stuck`` seconds ago."""
    now = time.time()
    values: dict[str, object] = dict(
        role=role,
        id=0,
        pid=123,
        state="running",
        time=now - age,
        progress=7,
        progress_time=now - stuck,
        heartbeat_timeout=3.0,
        progress_timeout=6.0,
        info={"host": "h"},
    )
    values.update(fields)
    return HealthRecord(**values)  # type: ignore[arg-type]


def fresh(rec: HealthRecord) -> HealthRecord:
    """A parametrized case's ``rec`` (made at MADE) as if it had been made now."""
    shift = time.time() - MADE
    return dataclasses.replace(rec, time=rec.time + shift, progress_time=rec.progress_time + shift)


class Views:
    """What the server under test answers from; a test swaps ``current``."""

    def __init__(self) -> None:
        self.current = ProbeView(None)

    def __call__(self) -> ProbeView:
        return self.current


def get(url: str, method: str = "GET") -> tuple[int, dict[str, object], dict[str, str]]:
    """(status, JSON body, headers) of one request, whatever the status."""
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, json.loads(answer.read() or b"{}"), dict(answer.headers)
    except urllib.error.HTTPError as exc:
        body = exc.read()
        return exc.code, json.loads(body) if body else {}, dict(exc.headers)


@pytest.fixture
def served() -> Iterator[tuple[HealthServer, Views]]:
    views = Views()
    server = HealthServer("127.0.0.1:0", views)
    try:
        yield server, views
    finally:
        server.close()


# --------------------------------------------------------------------------------------------
# /healthz: the verdict of `zmqrl health`
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "rec", "status", "words"),
    [
        ("healthy", record(), 200, "healthy: running"),
        ("hung", record(stuck=30.0), 503, "no progress for"),
        ("dead", record(age=10.0, stuck=10.0), 503, "no heartbeat for"),
        ("finished", record(state="finished"), 503, "has finished"),
        ("ended by its watchdog", record(state="hung"), 503, "its watchdog ended it"),
    ],
)
def test_healthz_answers_the_verdict_of_zmqrl_health(
    served: tuple[HealthServer, Views], case: str, rec: HealthRecord, status: int, words: str
) -> None:
    server, views = served
    rec = fresh(rec)
    views.current = ProbeView(rec, {"weights_version": 3})
    code, body, headers = get(f"{server.url}/healthz")
    healthy, reason = judge(rec)
    assert (code, body["ok"]) == (status, healthy), case
    assert words in str(body["reason"]) and words in reason, case
    assert str(body["reason"]).split(":")[0] == reason.split(":")[0]  # the same words, not a paraphrase
    assert headers["Content-Type"] == "application/json"


def test_healthz_before_the_first_heartbeat_is_503(served: tuple[HealthServer, Views]) -> None:
    server, _ = served
    code, body, _ = get(f"{server.url}/healthz")
    assert code == 503 and "no heartbeat yet" in str(body["reason"])


# --------------------------------------------------------------------------------------------
# /readyz: can the role do its job now
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "view", "ready", "words"),
    [
        (
            "learner bound, waiting for replay",
            ProbeView(record("learner", info=LEARNER_INFO)),
            True,
            "waiting",
        ),
        (
            "learner training",
            ProbeView(record("learner", info=LEARNER_INFO), {"updates": 40, "weights_version": 2}),
            True,
            "40 updates",
        ),
        ("learner not yet bound", ProbeView(record("learner")), False, "not bound its samples and weights"),
        ("learner starting", ProbeView(record("learner", info=LEARNER_INFO, progress=0)), False, "starting"),
        (
            "learner finished",
            ProbeView(record("learner", info=LEARNER_INFO, state="finished")),
            False,
            "finished",
        ),
        ("actor without weights", ProbeView(record(), {"weights_version": 0}), False, "no weights"),
        ("actor holding weights", ProbeView(record(), {"weights_version": 5}), True, "weights v5"),
        ("actor hung with weights", ProbeView(record(stuck=30.0), {"weights_version": 5}), False, "hung"),
        ("evaluator without weights", ProbeView(record("evaluator")), False, "no weights"),
        ("evaluator holding weights", ProbeView(record("evaluator"), {"weights_version": 1}), True, "v1"),
        ("no heartbeat yet", ProbeView(None), False, "no heartbeat yet"),
    ],
)
def test_readiness(case: str, view: ProbeView, ready: bool, words: str) -> None:
    if view.record is not None:
        view = ProbeView(fresh(view.record), view.counters)
    ok, reason = readyz(view)
    assert ok is ready, (case, reason)
    assert words in reason, (case, reason)


def test_readyz_over_http_follows_the_role(served: tuple[HealthServer, Views]) -> None:
    server, views = served
    views.current = ProbeView(record(), {"weights_version": 0})
    assert get(f"{server.url}/readyz")[0] == 503
    views.current = ProbeView(record(), {"weights_version": 1})
    code, body, _ = get(f"{server.url}/readyz?verbose=1")  # a query string is ignored
    assert (code, body["ok"]) == (200, True)


# --------------------------------------------------------------------------------------------
# Anything else: 404, 405, 500; never the role's end
# --------------------------------------------------------------------------------------------


def test_unknown_paths_are_404_and_other_methods_405(served: tuple[HealthServer, Views]) -> None:
    server, views = served
    views.current = ProbeView(record(), {"weights_version": 1})
    for path in ("/", "/metrics", "/healthz/x"):
        code, body, _ = get(f"{server.url}{path}")
        assert code == 404 and "/healthz" in str(body["reason"]), path
    for method in ("POST", "PUT", "DELETE", "HEAD", "OPTIONS"):
        code, _, headers = get(f"{server.url}/healthz", method)
        assert code == 405 and headers["Allow"] == "GET", method
    assert get(f"{server.url}/healthz")[0] == 200, "still serving"


def test_a_failing_handler_is_a_500_counted_and_logged_and_the_server_goes_on(
    served: tuple[HealthServer, Views], caplog: pytest.LogCaptureFixture
) -> None:
    server, views = served

    def broken() -> ProbeView:
        raise RuntimeError("boom")

    server.view = broken
    assert [get(f"{server.url}/healthz")[0] for _ in range(2)] == [500, 500]
    assert server.errors == 2
    assert sum("health http: GET /healthz failed" in r.getMessage() for r in caplog.records) == 2
    server.view = views
    views.current = ProbeView(record(), {"weights_version": 1})
    assert get(f"{server.url}/readyz")[0] == 200


# --------------------------------------------------------------------------------------------
# The address: config check, bind failure, release
# --------------------------------------------------------------------------------------------


def test_the_address_setting_is_checked(tmp_path: Path) -> None:
    assert parse_http_address("0.0.0.0:8080") == ("0.0.0.0", 8080)
    assert parse_http_address("[::1]:0") == ("::1", 0)
    assert health_http_problem(tiny_config(tmp_path)) is None  # off
    assert health_http_problem(tiny_config(tmp_path, supervisor__health_http="127.0.0.1:0")) is None
    for bad in ("8080", "localhost", ":80", "host:http", "host:70000", "::1:80"):
        cfg = dataclasses.replace(Config(), supervisor=SupervisorConfig(health_http=bad))
        problem = health_http_problem(cfg)
        assert problem is not None and problem.startswith("supervisor.health_http: "), bad
        with pytest.raises(ConfigError, match=r"supervisor\.health_http: "):  # and loading refuses it
            tiny_config(tmp_path, supervisor__health_http=bad)


def test_a_fixed_port_is_refused_where_every_role_shares_one_host(tmp_path: Path) -> None:
    assert shared_host_problem(tiny_config(tmp_path)) is None
    assert shared_host_problem(tiny_config(tmp_path, supervisor__health_http="127.0.0.1:0")) is None
    problem = shared_host_problem(tiny_config(tmp_path, supervisor__health_http="0.0.0.0:8080"))
    assert problem is not None and problem.startswith(
        "supervisor.health_http: port 8080 under `zmqrl launch`"
    )
    assert "0.0.0.0:0" in problem


def test_zmqrl_launch_refuses_a_fixed_health_port_before_starting_anything(run_root: Path) -> None:
    cmd = [sys.executable, "-m", "zmqrl", "launch", "configs/cartpole_dqn.yaml"]
    for item in tiny_overrides(run_root, supervisor__health_http="127.0.0.1:8080"):
        cmd += ["--set", item]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "supervisor.health_http: port 8080 under `zmqrl launch`" in errors[0]
    assert not (run_root / "t" / "logs").exists()  # no role was started


def test_a_taken_port_is_a_bind_error_naming_the_setting_and_close_frees_the_port() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(BindError, match=r"supervisor\.health_http"):
            HealthServer(f"127.0.0.1:{port}", Views())
    server = HealthServer("127.0.0.1:0", Views())
    address = server.address
    server.close()
    with pytest.raises(OSError):
        socket.create_connection(parse_http_address(address), timeout=1).close()
    again = HealthServer(address, Views())  # the port is free again at once
    again.close()


# --------------------------------------------------------------------------------------------
# The link starts it, reports its address and stops it
# --------------------------------------------------------------------------------------------


def link_config(tmp_path: Path, health_http: str | None) -> Config:
    return tiny_config(
        tmp_path,
        supervisor__health_http="null" if health_http is None else health_http,
        transport__heartbeat=f"ipc://{tmp_path}/hb",
        transport__control=f"ipc://{tmp_path}/ctl",
    )


def test_the_link_serves_its_beats_and_reports_where(ctx: zmq.Context, tmp_path: Path) -> None:
    cfg = link_config(tmp_path, "127.0.0.1:0")
    link = SupervisorLink(ctx, cfg, "learner", 0, watch_supervisor=False, start=False)
    try:
        assert link.http is not None
        url = link.http.url
        assert get(f"{url}/healthz")[0] == 503, "no beat yet"
        link.tick(lambda: {"updates": 0, "weights_version": 1}, LEARNER_INFO)
        code, body, _ = get(f"{url}/readyz")
        assert code == 200 and "waiting for replay" in str(body["reason"])
        assert get(f"{url}/healthz")[0] == 200
        view = link.probe_view()
        assert view.record is not None
        assert view.record.info[http_probe.INFO_KEY] == link.http.address  # in every heartbeat's info
        link.final("finished", {"updates": 300})
        assert get(f"{url}/healthz")[0] == 503
    finally:
        link.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/healthz", timeout=1)


def test_the_link_without_the_setting_serves_nothing(ctx: zmq.Context, tmp_path: Path) -> None:
    link = SupervisorLink(ctx, link_config(tmp_path, None), "actor", 0, watch_supervisor=False, start=False)
    try:
        link.tick(lambda: {})
        assert link.http is None
        view = link.probe_view()
        assert view.record is not None and http_probe.INFO_KEY not in view.record.info
    finally:
        link.close()


def test_a_role_whose_health_port_is_taken_exits_1_naming_the_setting(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cmd = [sys.executable, "-m", "zmqrl", "learner", str(CONFIG), "--set", f"run.dir={tmp_path}"]
        cmd += [
            "--set",
            f"supervisor.health_http=127.0.0.1:{port}",
            "--set",
            "transport.samples=tcp://127.0.0.1:0",
        ]
        cmd += ["--set", "transport.weights=tcp://127.0.0.1:0"]
        done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "supervisor.health_http" in last and f"127.0.0.1:{port}" in last, done.stderr
    assert "Traceback" not in done.stderr
