"""The HTTP endpoints against clients that connect and send nothing (issue 37 items 1, 2 and 7):
the supervisor's ``/metrics`` still answers a scrape and closes in bounded time with an idle
client open; a role's ``/healthz`` under a 128-descriptor limit still answers, and leaves the role
its files, with 200 idle clients open; connections over the cap push out the oldest, idle ones are
dropped after the timeout; a bind beyond loopback is one warning. Loopback ports only."""

from __future__ import annotations

import contextlib
import json
import logging
import resource
import select
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, tiny_config, wait_until
from zmqrl.config_checks import parse_http_address
from zmqrl.runtime import http_server
from zmqrl.runtime.http_probe import HealthServer, ProbeView
from zmqrl.runtime.http_server import CLOSE_SECONDS, MAX_CONNECTIONS, exposure_warning
from zmqrl.supervisor.prometheus import PrometheusExporter

# Seconds a request to a server under test may take: far above a loopback answer (milliseconds),
# far below the 5 s a client would have to wait on one idle connection.
ANSWER_SECONDS = 2.0
# Idle clients of the descriptor test, and how many connect at once: a few, as a scanner would,
# within even the library's backlog of 5, so that each one reaches the server.
IDLE_CLIENTS = 200
BATCH = 4
# The child's descriptor limit and the files it must still open (the measurement).
CHILD_NOFILE = 128
CHILD_FILES = 64


def get(url: str) -> tuple[int, bytes]:
    """(status, body) of a GET answered within ANSWER_SECONDS; raises if it is not."""
    try:
        with urllib.request.urlopen(url, timeout=ANSWER_SECONDS) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def connected(sock: socket.socket) -> bool:
    """Whether a non-blocking connect has completed (the server's kernel took the handshake)."""
    _, writable, _ = select.select([], [sock], [], 0)
    return bool(writable) and sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0


@contextlib.contextmanager
def idle_clients(address: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` TCP connections to ``address`` that send nothing, all connected when yielded
    (opened ``BATCH`` at a time); closed at the end."""
    host, port = parse_http_address(address)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < count + 256:  # this process holds one descriptor per client besides pytest's own
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, count + 256), hard))
    clients: list[socket.socket] = []
    try:
        while len(clients) < count:
            batch = []
            for _ in range(min(BATCH, count - len(clients))):
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                clients.append(sock)
                batch.append(sock)
                sock.setblocking(False)
                sock.connect_ex((host, port))
            wait_until(
                lambda: all(connected(s) for s in batch),  # noqa: B023 (called before the next batch)
                5,
                f"{len(clients)} idle clients to connect (has the server stopped accepting?)",
            )
        yield clients
    finally:
        for sock in clients:
            sock.close()


def hung_up(sock: socket.socket) -> bool:
    """Whether the server closed this client's connection (it reads end of file, or a reset)."""
    readable, _, _ = select.select([sock], [], [], 0)
    if not readable:
        return False
    try:
        return sock.recv(1) == b""
    except OSError:
        return True


def closed_within(close: Callable[[], None], seconds: float) -> float:
    """Run ``close()`` on a thread; the seconds it took, asserted under ``seconds`` (a close that
    hangs fails the test instead of hanging it)."""
    began = time.monotonic()
    closer = threading.Thread(target=close, daemon=True)
    closer.start()
    closer.join(timeout=seconds)
    assert not closer.is_alive(), f"close() still waiting after {seconds} s"
    return time.monotonic() - began


def refuses(address: str) -> bool:
    try:
        socket.create_connection(parse_http_address(address), timeout=1).close()
    except OSError:
        return True
    return False


# --------------------------------------------------------------------------------------------
# Item 1: /metrics with an idle client
# --------------------------------------------------------------------------------------------


def test_an_idle_client_holds_up_neither_a_scrape_nor_the_close_of_metrics(tmp_path: Path) -> None:
    exporter = PrometheusExporter(tiny_config(tmp_path), {}, command="launch")
    said: list[str] = []
    url = exporter.start(said.append)
    assert url is not None and said == []
    address = url.removeprefix("http://").removesuffix("/metrics")
    try:
        with idle_clients(address, 1) as (idle,):
            status, body = get(url)
            assert status == 200 and b"zmqrl_run_info" in body
            took = closed_within(exporter.close, CLOSE_SECONDS + 1.0)
            print(f"\nmetrics close() with an idle client open: {took:.3f} s")
            wait_until(lambda: hung_up(idle), ANSWER_SECONDS, "the idle client hung up on")
    finally:
        exporter.close()
    assert refuses(address)


# --------------------------------------------------------------------------------------------
# Item 2: a role's probe under a descriptor limit, with 200 idle clients
# --------------------------------------------------------------------------------------------

# The role's side: a probe server under the descriptor limit, which opens files when told to.
CHILD = f"""
import os, resource, sys
from pathlib import Path
from zmqrl.runtime.http_probe import HealthServer, ProbeView
resource.setrlimit(resource.RLIMIT_NOFILE, ({CHILD_NOFILE}, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
server = HealthServer("127.0.0.1:0", lambda: ProbeView(None))
Path(sys.argv[1]).write_text(server.address)
sys.stdin.readline()
opened = []
for _ in range({CHILD_FILES}):
    try:
        opened.append(open(os.devnull))
    except OSError:
        break
print(len(opened), flush=True)
server.close()
"""


def test_200_idle_clients_leave_a_role_its_descriptors_and_the_probe_its_answer(tmp_path: Path) -> None:
    where = tmp_path / "address"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(where)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_until(
            lambda: (where.is_file() and where.read_text()) or child.poll() is not None, 30, "a server"
        )
        assert child.poll() is None, child.communicate()
        address = where.read_text()
        with idle_clients(address, IDLE_CLIENTS):
            status, body = get(f"http://{address}/healthz")  # accepted after every idle client
            assert status == 503 and "no heartbeat yet" in json.loads(body)["reason"]
            out, err = child.communicate("open\n", timeout=10)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, err
    assert int(out.strip()) == CHILD_FILES, f"opened {out.strip()} of {CHILD_FILES} files:\n{err}"


# --------------------------------------------------------------------------------------------
# The bounds themselves: the cap, the timeout
# --------------------------------------------------------------------------------------------


def test_a_connection_over_the_cap_pushes_out_the_oldest_at_once() -> None:
    server = HealthServer("127.0.0.1:0", lambda: ProbeView(None))
    try:
        with idle_clients(server.address, MAX_CONNECTIONS) as clients:
            wait_until(lambda: server._server.open_connections() == MAX_CONNECTIONS, 2, "all served")
            assert not any(hung_up(c) for c in clients)
            with idle_clients(server.address, 1):
                wait_until(lambda: hung_up(clients[0]), ANSWER_SECONDS, "the oldest pushed out")
                assert server._server.open_connections() == MAX_CONNECTIONS
                assert not any(hung_up(c) for c in clients[1:])
                assert get(f"{server.url}/healthz")[0] == 503  # the probe gets in: the next oldest goes
                wait_until(lambda: hung_up(clients[1]), ANSWER_SECONDS, "the next oldest pushed out")
            took = closed_within(server.close, CLOSE_SECONDS + 1.0)
            print(f"\nprobe close() with {MAX_CONNECTIONS - 2} idle clients open: {took:.3f} s")
            assert all(hung_up(c) for c in clients)
    finally:
        server.close()
    assert refuses(server.address)


def test_an_idle_client_is_dropped_after_the_request_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http_server.BoundedServer, "request_seconds", 0.2)
    server = HealthServer("127.0.0.1:0", lambda: ProbeView(None))
    try:
        with idle_clients(server.address, 2) as (idle, talking):
            talking.sendall(b"GET /healthz HTTP/1.0\r\n")  # a request begun, never finished
            began = time.monotonic()
            wait_until(lambda: hung_up(idle) and hung_up(talking), 2, "both dropped")
            print(f"\ndropped after {time.monotonic() - began:.2f} s (timeout 0.2 s)")
            wait_until(lambda: server._server.open_connections() == 0, 1, "their descriptors freed")
    finally:
        server.close()


# --------------------------------------------------------------------------------------------
# Item 7: a bind beyond loopback is allowed with one warning
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "exposed"),
    [
        ("127.0.0.1", False),
        ("127.0.0.2", False),
        ("localhost", False),
        ("::1", False),
        ("0.0.0.0", True),
        ("::", True),
        ("10.1.2.3", True),
        ("learner.example", True),
    ],
)
def test_the_exposure_rule_is_the_sockets_rule(host: str, exposed: bool) -> None:
    line = exposure_warning("supervisor.health_http", host, 8080, "/healthz and /readyz")
    assert (line is not None) == exposed
    if line is not None:
        shown = f"[{host}]" if ":" in host else host
        assert line.startswith(f"supervisor.health_http {shown}:8080 serves /healthz and /readyz to anyone")


def test_an_exposed_bind_is_one_warning_from_either_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Loopback stays quiet; an address beyond it (faked here: tests bind loopback only) warns."""
    quiet = HealthServer("127.0.0.1:0", lambda: ProbeView(None))
    quiet.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    monkeypatch.setattr(http_server, "is_loopback", lambda endpoint: False)
    with caplog.at_level(logging.WARNING, logger="zmqrl.http_probe"):
        probe = HealthServer("127.0.0.1:0", lambda: ProbeView(None))
        probe.close()
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1, warned
    assert warned[0].startswith(f"supervisor.health_http {probe.address} serves /healthz and /readyz to ")
    said: list[str] = []
    exporter = PrometheusExporter(tiny_config(tmp_path), {}, command="launch")
    url = exporter.start(said.append)
    exporter.close()
    assert url is not None and len(said) == 1, said
    address = url.removeprefix("http://").removesuffix("/metrics")
    assert said[0].startswith(f"warning: supervisor.metrics_http {address} serves /metrics to anyone")
