"""The supervisor's Prometheus collector on made-up slots: names, types, labels and values as the
catalog says, a restarted slot's counters, the policy-lag histogram, the HTTP server (port 0, a
port in use), and the supervisor's monitor serving it from open to close. Read back with
prometheus_client's own text parser, as a scraper would."""

from __future__ import annotations

import dataclasses
import io
import re
import socket
import time
import urllib.request
from pathlib import Path

import pytest
import zmq
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from tests.conftest import tiny_config
from zmqrl.config import Config
from zmqrl.config_checks import metrics_http_problem, parse_http_address
from zmqrl.metrics.catalog import ANY_ROLE, COUNTER, FEED_TEXT, GAUGE, HISTOGRAM, PROMETHEUS, metric_table
from zmqrl.runtime.link import socket_limits
from zmqrl.supervisor.live import ConsoleView
from zmqrl.supervisor.liveness import Liveness
from zmqrl.supervisor.monitor import RunMonitor
from zmqrl.supervisor.prometheus import URL_LINE, LagHistogram, PrometheusExporter
from zmqrl.supervisor.status import StatusRecord
from zmqrl.supervisor.summary import Slot
from zmqrl.transport.wire import HeartbeatMsg

ROLES = ("learner", "actor", "evaluator")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def config(address: str | None = "127.0.0.1:0") -> Config:
    cfg = Config()
    return dataclasses.replace(cfg, supervisor=dataclasses.replace(cfg.supervisor, metrics_http=address))


def slot(role: str, index: int, clock: Clock, state: str = "running", **counters: float) -> Slot:
    s = Slot(role, index, Liveness(started=clock.now, pid=1000 + index, role=role))
    beat(s, clock, state, **counters)
    return s


def beat(s: Slot, clock: Clock, state: str = "running", **counters: float) -> None:
    s.live.heard(HeartbeatMsg(s.role, s.id, s.live.pid or 0, 0.0, state, dict(counters), {}), clock.now)


def scrape(exporter: PrometheusExporter) -> dict[str, tuple[str, list[Sample]]]:
    """family name -> (type, samples), as a scraper parses the text exposition."""
    text = generate_latest(exporter.registry).decode()
    return {f.name: (f.type, list(f.samples)) for f in text_string_to_metric_families(text)}


def value(families: dict[str, tuple[str, list[Sample]]], name: str, **labels: str) -> float:
    family = name.removesuffix("_total")
    found = [s.value for s in families[family][1] if s.name == name and s.labels == labels]
    assert len(found) == 1, f"{name}{labels}: {families[family][1]}"
    return found[0]


@pytest.fixture
def clock() -> Clock:
    return Clock()


def a_run(clock: Clock) -> tuple[dict[str, Slot], PrometheusExporter]:
    slots = {
        "learner-0": slot(
            "learner", 0, clock, updates=1200, samples=9000, replay_size=5000, replay_capacity=10000,
            replay_mb=1.5, samples_per_insert=4.0, policy_lag=0.5, weights_version=60, progress=900,
            bad_messages=3, bad_control=1, auth_denied=2, eval_return=200.0,
        ),
        "actor-0": slot("actor", 0, clock, steps=8000, samples=7990, weights_version=59, steps_per_s=900.0),
        "actor-1": slot("actor", 1, clock, steps=50, weights_version=60, bad_messages=4),
        "evaluator-0": slot("evaluator", 0, clock, evaluations=3, eval_return=180.0, eval_seconds=1.25),
    }  # fmt: skip
    slots["actor-1"].restart_times = [10.0, 20.0]  # restarted twice: its steps counted from 0 again
    exporter = PrometheusExporter(config(), slots, command="launch", clock=clock)
    exporter.supervisor_counts(bad_heartbeats=5, bad_status=1)
    exporter.publish(force=True)
    return slots, exporter


def test_every_catalog_metric_is_exported_with_its_type_and_help(clock: Clock) -> None:
    _, exporter = a_run(clock)
    families = scrape(exporter)
    for metric in PROMETHEUS:
        kind, _samples = families[metric.family]
        assert kind == metric.kind, metric.name
    assert set(families) == {m.family for m in PROMETHEUS}, "only the catalog's metrics"
    text = generate_latest(exporter.registry).decode()
    assert "# HELP zmqrl_learner_updates_total gradient updates" in text


def test_heartbeat_counters_become_labelled_samples_with_the_catalogs_scale(clock: Clock) -> None:
    _, exporter = a_run(clock)
    f = scrape(exporter)
    learner = {"role": "learner", "id": "0"}
    assert value(f, "zmqrl_learner_updates_total", **learner) == 1200
    assert value(f, "zmqrl_learner_samples_total", **learner) == 9000
    assert value(f, "zmqrl_learner_replay_size", **learner) == 5000
    assert value(f, "zmqrl_learner_replay_capacity", **learner) == 10000
    assert value(f, "zmqrl_learner_replay_bytes", **learner) == 1.5 * 2**20
    assert value(f, "zmqrl_learner_replay_ratio", **learner) == 4.0
    assert value(f, "zmqrl_learner_eval_return", **learner) == 200.0
    assert value(f, "zmqrl_loop_iterations_total", **learner) == 900
    assert value(f, "zmqrl_actor_env_steps_total", role="actor", id="0") == 8000
    assert value(f, "zmqrl_actor_env_steps_per_second", role="actor", id="0") == 900.0
    assert value(f, "zmqrl_evaluator_eval_duration_seconds", role="evaluator", id="0") == 1.25
    versions = {s.labels["role"] + s.labels["id"]: s.value for s in f["zmqrl_weights_version"][1]}
    assert versions == {"learner0": 60, "actor0": 59, "actor1": 60}
    # A counter a role does not report (the actor has no learner updates) has no sample at all.
    assert [s.labels for s in f["zmqrl_learner_updates"][1]] == [learner]
    assert (
        value(f, "zmqrl_run_info", run="cartpole_dqn", command="launch", agent="dqn", env="CartPole-v1") == 1
    )


def test_a_restarted_slot_counts_its_restarts_and_its_counters_start_again(clock: Clock) -> None:
    slots, exporter = a_run(clock)
    f = scrape(exporter)
    assert value(f, "zmqrl_restarts_total", role="actor", id="1") == 2
    assert value(f, "zmqrl_restarts_total", role="actor", id="0") == 0
    assert value(f, "zmqrl_actor_env_steps_total", role="actor", id="1") == 50
    actor = slots["actor-1"]  # restarted once more: down until the new process beats, same labels
    actor.restart_times.append(30.0)
    actor.live = actor.live.renew(clock.now, 2001)
    exporter.publish(force=True)
    f = scrape(exporter)
    assert value(f, "zmqrl_restarts_total", role="actor", id="1") == 3
    assert value(f, "zmqrl_up", role="actor", id="1") == 0
    beat(actor, clock, steps=7)
    exporter.publish(force=True)
    f = scrape(exporter)
    assert value(f, "zmqrl_up", role="actor", id="1") == 1
    assert value(f, "zmqrl_actor_env_steps_total", role="actor", id="1") == 7


def test_up_is_0_for_a_silent_an_exiting_or_a_retired_process(clock: Clock) -> None:
    slots, exporter = a_run(clock)
    assert all(value(scrape(exporter), "zmqrl_up", role=s.role, id=str(s.id)) == 1 for s in slots.values())
    clock.now += config().supervisor.heartbeat_timeout + 0.1
    beat(slots["learner-0"], clock, "finished", updates=1300)
    beat(slots["evaluator-0"], clock)
    slots["evaluator-0"].retired = True
    exporter.publish(force=True)
    f = scrape(exporter)
    ups = {s.labels["role"] + s.labels["id"]: s.value for s in f["zmqrl_up"][1]}
    assert ups == {"learner0": 0, "actor0": 0, "actor1": 0, "evaluator0": 0}
    assert value(f, "zmqrl_heartbeat_age_seconds", role="actor", id="0") == pytest.approx(3.1)
    assert value(f, "zmqrl_heartbeat_age_seconds", role="learner", id="0") == 0


def test_bad_messages_are_one_counter_by_reason_the_supervisors_own_included(clock: Clock) -> None:
    _, exporter = a_run(clock)
    f = scrape(exporter)
    got = {
        (s.labels["role"], s.labels["id"], s.labels["reason"]): s.value for s in f["zmqrl_bad_messages"][1]
    }
    assert got == {
        ("learner", "0", "message"): 3,
        ("learner", "0", "control"): 1,
        ("learner", "0", "auth"): 2,
        ("actor", "1", "message"): 4,
        ("supervisor", "0", "heartbeat"): 5,
        ("supervisor", "0", "status"): 1,
    }


def test_the_scrape_reads_the_published_copy_never_the_live_slots(clock: Clock) -> None:
    slots, exporter = a_run(clock)
    beat(slots["learner-0"], clock, updates=5000)  # the loop's own data moves on...
    slots["learner-0"].live.last.counters["updates"] = 9999  # type: ignore[union-attr]
    assert value(scrape(exporter), "zmqrl_learner_updates_total", role="learner", id="0") == 1200
    clock.now += 1.0  # ...and the scrape sees it once the loop publishes (refresh, when due)
    exporter.server = object()  # type: ignore[assignment]  # refresh publishes only while serving
    exporter.refresh()
    exporter.server = None
    assert value(scrape(exporter), "zmqrl_learner_updates_total", role="learner", id="0") == 9999


def test_policy_lag_histogram_counts_each_learner_heartbeat_once(clock: Clock) -> None:
    slots, exporter = a_run(clock)
    hist = exporter.lag
    hist.observe_slots(slots)
    hist.observe_slots(slots)  # the same heartbeat again: not counted twice
    for lag in (3.0, 300.0):
        beat(slots["learner-0"], clock, policy_lag=lag)
        hist.observe_slots(slots)
    beat(slots["learner-0"], clock)  # no lag measured yet (NaN is left out of heartbeats)
    hist.observe_slots(slots)
    exporter.publish(force=True)
    samples = scrape(exporter)["zmqrl_learner_policy_lag_sampled_versions"][1]
    buckets = {s.labels["le"]: s.value for s in samples if s.name.endswith("_bucket")}
    assert buckets["0.0"] == 0 and buckets["1.0"] == 1 and buckets["4.0"] == 2 and buckets["128.0"] == 2
    assert buckets["+Inf"] == 3
    count = next(s.value for s in samples if s.name.endswith("_count"))
    total = next(s.value for s in samples if s.name.endswith("_sum"))
    assert count == 3 and total == pytest.approx(303.5)
    assert {s.labels["role"] for s in samples} == {"learner"}
    assert LagHistogram().view().buckets[-1] == ("+Inf", 0.0)


def test_the_catalog_names_follow_prometheus_conventions() -> None:
    assert len(metric_table()) == len(PROMETHEUS), "a metric is listed twice"
    for m in PROMETHEUS:
        assert re.fullmatch(r"zmqrl_[a-z0-9_]+", m.name), m.name
        assert m.kind in (COUNTER, GAUGE, HISTOGRAM), m.name
        assert m.name.endswith("_total") == (m.kind == COUNTER), f"{m.name}: _total is for counters only"
        if m.role in ROLES:
            assert m.name.startswith(f"zmqrl_{m.role}_"), f"{m.name}: named for its role"
        else:
            assert m.role in (ANY_ROLE, "supervisor"), m.name
        unit = {"seconds": "_seconds", "bytes": "_bytes"}.get(m.unit)
        if unit is not None:
            assert m.name.removesuffix("_total").endswith(unit), f"{m.name}: unit {m.unit} in the name"
        assert m.meaning and "|" not in m.meaning, m.name
        assert m.feed in FEED_TEXT or re.fullmatch(r"[a-z_]+", m.feed), m.name
        assert (m.kind == HISTOGRAM) == bool(m.buckets), m.name


@pytest.mark.parametrize(
    ("address", "problem"),
    [
        ("127.0.0.1:9464", None),
        ("0.0.0.0:0", None),
        ("[::1]:9464", None),
        ("localhost:65535", None),
        (None, None),
        ("9464", "HOST:PORT"),
        (":9464", "HOST:PORT"),
        ("127.0.0.1:99999", "from 0 to 65535"),
        ("127.0.0.1:http", "from 0 to 65535"),
        ("::1:9464", "IPv6 host in brackets"),
    ],
)
def test_metrics_http_problem_names_the_key(address: str | None, problem: str | None) -> None:
    found = metrics_http_problem(config(address))
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith("supervisor.metrics_http: ") and problem in found
    if address and problem is None:
        assert parse_http_address(address)[1] in (0, 9464, 65535)


def test_the_server_binds_port_0_serves_openmetrics_and_a_port_in_use_is_one_warning(clock: Clock) -> None:
    slots, exporter = a_run(clock)
    said: list[str] = []
    url = exporter.start(said.append)
    try:
        assert url is not None and re.fullmatch(r"http://127\.0\.0\.1:\d+/metrics", url) and not said
        assert not url.endswith(":0/metrics")
        request = urllib.request.Request(
            url, headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        with urllib.request.urlopen(request, timeout=5) as reply:
            assert reply.headers["Content-Type"].startswith("application/openmetrics-text")
            body = reply.read().decode()
        assert body.rstrip().endswith("# EOF")
        assert 'zmqrl_learner_updates_total{id="0",role="learner"} 1200.0' in body
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        taken = PrometheusExporter(config(f"127.0.0.1:{port}"), slots, command="launch", clock=clock)
        assert taken.start(said.append) is None
        assert len(said) == 1 and said[0].startswith(f"warning: supervisor.metrics_http 127.0.0.1:{port}: ")
        assert "the run goes on without it" in said[0]
        taken.close()  # nothing to close: harmless
        assert PrometheusExporter(config(None), slots, command="launch").start(said.append) is None
        assert len(said) == 1, "off is not a warning"
    finally:
        exporter.close()
    with socket.socket() as probe, pytest.raises(OSError):  # closed: the port answers no more
        probe.settimeout(1.0)
        probe.connect(("127.0.0.1", port))


def monitor_of(cfg: Config, slots: dict[str, Slot], said: list[str], clock: Clock) -> RunMonitor:
    return RunMonitor(
        cfg, ConsoleView(io.StringIO()), slots, lambda: "running", said.append, command="launch", clock=clock
    )


def test_the_monitor_says_the_url_first_serves_while_open_and_stops_at_close(
    tmp_path: Path, ctx: zmq.Context, clock: Clock
) -> None:
    slots, _ = a_run(clock)
    cfg = tiny_config(tmp_path)
    said: list[str] = []
    monitor = monitor_of(cfg, slots, said, clock)
    monitor.open(ctx, time.time(), socket_limits(cfg), None)
    try:
        url = monitor.metrics_url
        assert url is not None and said == []  # nothing is said before the supervisor's beat runs
        monitor.announce()
        assert said == [URL_LINE + url]
        record = StatusRecord.read(cfg.run_dir)  # `zmqrl status` and scripts find it there
        assert record is not None and record.metrics_url == url
        with urllib.request.urlopen(url, timeout=5) as reply:
            assert 'zmqrl_actor_env_steps_total{id="0",role="actor"} 8000.0' in reply.read().decode()
    finally:
        monitor.close()
    with pytest.raises(OSError):
        urllib.request.urlopen(url, timeout=2)


def test_a_port_in_use_is_one_warning_and_the_monitor_opens_all_the_same(
    tmp_path: Path, ctx: zmq.Context, clock: Clock
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        cfg = tiny_config(tmp_path, supervisor__metrics_http=f"127.0.0.1:{port}")
        said: list[str] = []
        monitor = monitor_of(cfg, {}, said, clock)
        try:
            endpoint = monitor.open(ctx, time.time(), socket_limits(cfg), None)
            monitor.announce()
            monitor.refresh()  # the loop goes on without /metrics
        finally:
            monitor.close()
    assert endpoint.startswith("tcp://") and monitor.metrics_url is None
    assert len(said) == 1 and said[0].startswith(f"warning: supervisor.metrics_http 127.0.0.1:{port}: "), said
