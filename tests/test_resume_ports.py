"""A resumed run binds what its config asked for, not the port its first start got (issue 37, item 8).

``runs/NAME/config.yaml`` holds the real ports once port 0 is resolved (the actors, and a learner
restarted in the same launch, read them there); ``zmqrl launch --resume`` asks for port 0 again, so
a port the OS has handed to someone else since does not stop it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, tiny_overrides
from zmqrl.config import TransportConfig
from zmqrl.supervisor.asked_endpoints import ENDPOINTS_FILE, asked_again, record

ANY = "tcp://127.0.0.1:0"


def test_a_port_0_endpoint_still_holding_its_first_port_asks_for_port_0_again(tmp_path: Path) -> None:
    asked = TransportConfig(samples=ANY, weights=ANY, heartbeat=ANY, control="tcp://127.0.0.1:6000")
    bound = replace(
        asked,
        samples="tcp://127.0.0.1:43143",
        weights="tcp://127.0.0.1:43144",
        heartbeat="tcp://127.0.0.1:43145",
    )
    record(tmp_path, asked, bound)
    assert set(json.loads((tmp_path / ENDPOINTS_FILE).read_text())) == {
        "transport.samples",
        "transport.weights",
        "transport.heartbeat",
    }, "only what port 0 resolved"
    # The weights endpoint was edited by hand since: it is the operator's now, and stays.
    saved = replace(bound, weights="tcp://127.0.0.1:7000")
    again = asked_again(tmp_path, saved)
    assert again == replace(saved, samples=ANY, heartbeat=ANY)


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]", '{"transport.samples": {"asked": 5}}'])
def test_a_run_directory_without_a_readable_record_changes_nothing(
    tmp_path: Path, content: str | None
) -> None:
    if content is not None:
        (tmp_path / ENDPOINTS_FILE).write_text(content)
    saved = TransportConfig(samples="tcp://127.0.0.1:43143")
    assert asked_again(tmp_path, saved) == saved


@contextlib.contextmanager
def taken(endpoint: str) -> Iterator[None]:
    """The endpoint's port held by another socket (someone else got it from the OS since).
    SO_REUSEADDR only lets it bind past the first run's connections in TIME_WAIT; listening, it
    keeps the port from anyone else (ZeroMQ's listeners set SO_REUSEADDR too)."""
    host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, int(port)))
        sock.listen()
        yield
    finally:
        sock.close()


def launch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zmqrl", "launch", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )


@pytest.mark.slow
def test_a_port_0_run_resumed_while_its_first_ports_are_taken_binds_fresh_ones(run_root: Path) -> None:
    run_dir = run_root / "t"
    sets = [arg for item in tiny_overrides(run_root, learner__max_updates=200) for arg in ("--set", item)]
    first = launch(str(REPO / "configs" / "cartpole_dqn.yaml"), *sets)
    assert first.returncode == 0, first.stdout + first.stderr
    given = yaml.safe_load((run_dir / "config.yaml").read_text())["transport"]
    assert all(not given[key].endswith(":0") for key in ("samples", "weights", "heartbeat", "control"))

    with taken(given["samples"]), taken(given["heartbeat"]):
        more = launch("--resume", str(run_dir), "--set", "learner.max_updates=300")
    assert more.returncode == 0, more.stdout + more.stderr
    now = yaml.safe_load((run_dir / "config.yaml").read_text())["transport"]
    assert now["samples"] != given["samples"] and now["heartbeat"] != given["heartbeat"]
    assert f"learner on {now['samples']} (samples)" in more.stdout, "announced as at the first start"
    stats = json.loads((run_dir / "stats.json").read_text())["learner"]
    assert stats["updates"] == 300 and stats["resumed_from"]["updates"] == 200
