"""A real `zmqrl launch` scraped over HTTP: first as a scraper does it (prometheus_client's text
parser), then by Debian's real Prometheus server (heavy), asked through its HTTP API that
zmqrl_learner_updates_total is above zero and rising.

A watch-only `zmqrl supervise` with a client connected to /metrics that sends nothing must still
answer a scrape, and exit within seconds of SIGTERM (issue 37 item 1).

The launch trains a tiny CartPole DQN with no update limit in reach and is stopped (SIGTERM) once
the test has seen what it needs; the run_root fixture kills anything left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import REPO, processes_mentioning, tiny_overrides, wait_until
from zmqrl.metrics.catalog import unexported
from zmqrl.supervisor.prometheus import URL_LINE

PROMETHEUS = "/usr/bin/prometheus"
# Learner updates the launch may make: far more than the test waits for (it is stopped earlier).
UPDATES = 100_000
URL = re.compile(re.escape(URL_LINE) + r"(http://\S+/metrics)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def launched(run_root: Path, command: str = "launch") -> Iterator[str]:
    """A launch (or supervise) in the background; yields its /metrics URL (read from its first
    lines), stops it with SIGTERM at the end."""
    with started(run_root, command) as (_, url):
        yield url


@contextlib.contextmanager
def started(run_root: Path, command: str) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``launched``'s process and URL: SIGTERM at the end, if the test did not end it first."""
    out = run_root.parent / f"{command}.out"
    run_root.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "zmqrl", command, str(REPO / "configs" / "cartpole_dqn.yaml")]
    for item in tiny_overrides(run_root, learner__max_updates=UPDATES):
        cmd += ["--set", item]
    with out.open("w") as sink:
        proc = subprocess.Popen(
            cmd, cwd=REPO, stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    try:
        wait_until(lambda: URL.search(out.read_text()) or proc.poll() is not None, 60, "the /metrics line")
        found = URL.search(out.read_text())
        assert found, f"no {URL_LINE!r} line:\n{out.read_text()}"
        yield proc, found.group(1)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert processes_mentioning(str(run_root)) == []


def numbers(stats: dict[str, object]) -> set[str]:
    """The keys of a role's final stats that are counters (numbers, not lists or words)."""
    return {k for k, v in stats.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def keep(seen: list[float], value: float) -> float:
    """``value``, noted in ``seen`` (a wait's condition that keeps what it saw)."""
    seen.append(value)
    return value


def scrape(url: str) -> dict[tuple[str, str, str], float]:
    """Every sample with role and id labels, as a scraper parses them: (name, role, id) -> value;
    the families' types checked against their names."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    samples: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("zmqrl_"), family.name
        for sample in family.samples:
            assert (family.type == "counter") == sample.name.endswith("_total"), sample.name
            if "role" in sample.labels and "le" not in sample.labels:
                samples[sample.name, sample.labels["role"], sample.labels["id"]] = float(sample.value)
    return samples


def scrape_updates(url: str) -> float:
    """zmqrl_learner_updates_total of the run's learner (0 before it reports)."""
    return scrape(url).get(("zmqrl_learner_updates_total", "learner", "0"), 0.0)


@pytest.mark.slow
def test_a_launch_serves_learner_updates_that_rise(run_root: Path) -> None:
    with launched(run_root) as url:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url) and not url.endswith(":0/metrics")
        seen: list[float] = []
        wait_until(lambda: keep(seen, scrape_updates(url)) > 0, 60, "updates > 0")
        first = seen[-1]
        wait_until(lambda: keep(seen, scrape_updates(url)) > first, 30, "updates rising")
        print(f"scraped zmqrl_learner_updates_total: {first:.0f}, then {seen[-1]:.0f}")
        samples = scrape(url)
        assert samples["zmqrl_up", "learner", "0"] == 1 and samples["zmqrl_up", "actor", "0"] == 1
        assert samples["zmqrl_actor_env_steps_total", "actor", "0"] > 0
        assert samples["zmqrl_restarts_total", "actor", "0"] == 0
        assert samples["zmqrl_learner_replay_size", "learner", "0"] > 0
    # Every counter the roles report is exported, or left out on purpose (catalog.LEFT_OUT): read
    # from their final stats (the learner's file, the actor's last output line), which hold them.
    learner = json.loads((run_root / "t" / "learner-stats.json").read_text())
    actor = json.loads((run_root / "t" / "logs" / "actor-0.log").read_text().splitlines()[-1])
    assert unexported("learner", numbers(learner)) == set()
    assert unexported("actor", numbers(actor) - {"actor"}) == set()


@pytest.mark.slow
def test_a_watch_only_supervisor_serves_metrics_too(run_root: Path) -> None:
    with launched(run_root, "supervise") as url, urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    (info,) = families["zmqrl_run_info"].samples
    assert info.labels["command"] == "supervise" and info.labels["run"] == "t"
    assert families["zmqrl_up"].samples == [], "no role has reported yet"


# Seconds a supervisor may take from SIGTERM to its exit with an idle client on /metrics (issue
# 37 item 1: it used to wait for that client forever).
EXIT_SECONDS = 5.0


@pytest.mark.slow
def test_an_idle_metrics_client_stops_neither_a_scrape_nor_the_supervisors_exit(run_root: Path) -> None:
    with started(run_root, "supervise") as (proc, url):
        host, port = urllib.parse.urlsplit(url).hostname, urllib.parse.urlsplit(url).port
        assert host is not None and port is not None
        with socket.create_connection((host, port), timeout=5):  # connected, sends nothing
            with urllib.request.urlopen(url, timeout=2) as reply:
                assert b"zmqrl_run_info" in reply.read()
            began = time.monotonic()
            proc.send_signal(signal.SIGTERM)
            try:
                code = proc.wait(timeout=EXIT_SECONDS)
            except subprocess.TimeoutExpired:
                pytest.fail(f"zmqrl supervise still running {EXIT_SECONDS} s after SIGTERM")
            print(f"\nsupervise exited {code} {time.monotonic() - began:.2f} s after SIGTERM")
    out = (run_root.parent / "supervise.out").read_text()
    assert "Traceback" not in out, out


def query(api: str, promql: str) -> list[dict[str, object]]:
    """The result vector of an instant query to Prometheus' HTTP API."""
    url = f"{api}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=5) as reply:
        answer = json.loads(reply.read())
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def updates_in(result: list[dict[str, object]]) -> float:
    values = [float(r["value"][1]) for r in result]  # type: ignore[index]
    return max(values, default=0.0)


def ready(api: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api}/-/ready", timeout=2) as reply:
            return reply.status == 200
    except OSError:
        return False


@pytest.mark.slow  # about 8 s: a real Prometheus server besides a launch
def test_a_real_prometheus_server_scrapes_a_launch(run_root: Path, tmp_path: Path) -> None:
    if not Path(PROMETHEUS).is_file() and shutil.which("prometheus") is None:
        pytest.skip("Prometheus is not installed (Debian: apt-get install prometheus)")
    binary = PROMETHEUS if Path(PROMETHEUS).is_file() else str(shutil.which("prometheus"))
    with launched(run_root) as url:
        target = urllib.parse.urlsplit(url).netloc
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: zmqrl\n    scrape_interval: 1s\n"
            f"    static_configs:\n      - targets: ['{target}']\n"
        )
        port = free_port()
        api = f"http://127.0.0.1:{port}"
        log = (tmp_path / "prometheus.log").open("w")
        server = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        try:
            wait_until(lambda: ready(api) or server.poll() is not None, 60, "Prometheus ready")
            assert server.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
            results: list[list[dict[str, object]]] = []
            promql = "zmqrl_learner_updates_total"

            def answered() -> float:
                results.append(query(api, promql))
                return updates_in(results[-1])

            wait_until(lambda: answered() > 0, 60, "a value > 0")
            first = results[-1]
            wait_until(lambda: answered() > updates_in(first), 60, "a higher value")
            later = results[-1]
            print(f"Prometheus {promql}: {json.dumps(first)}")
            print(f"Prometheus {promql} later: {json.dumps(later)}")
            labels = first[0]["metric"]
            assert isinstance(labels, dict)
            assert labels["role"] == "learner" and labels["id"] == "0" and labels["job"] == "zmqrl"
            up = query(api, 'up{job="zmqrl"}')
            assert updates_in(up) == 1, up
            rate = query(api, "rate(zmqrl_learner_updates_total[5s])")
            print(f"Prometheus rate(zmqrl_learner_updates_total[5s]): {json.dumps(rate)}")
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            log.close()
