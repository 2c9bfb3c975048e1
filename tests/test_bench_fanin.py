"""`zmqrl bench`'s fan-in part: N simulated actors (each with its own samples, weights, heartbeat
and control sockets) at one total rate against a real learner and supervisor, and the mlp part.

The arithmetic (pacing, rates and CPU costs between readings, publish-to-arrival latencies) is
tested on made-up numbers; one slow test runs the part for real in quick mode and checks the rows
it returns and that every process it started is gone. Speed is never asserted.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import processes_mentioning, wait_until
from zmqrl.config import load_config
from zmqrl.transport import wire
from zmqrl.transport.messages import StopMsg, WeightsMsg
from zmqrl.types import Weights
from zmqrl_bench import cli, fanin, fanin_peers, fanin_roles, fanin_stats, mlp
from zmqrl_bench.actor import CARTPOLE
from zmqrl_bench.fanin_clock import VERSION_FILE, PublishClock, event_names
from zmqrl_bench.fanin_peers import PeerReport, Schedule, weights_version
from zmqrl_bench.fanin_stats import Reading, intervals, latencies
from zmqrl_bench.report import CPU_PER_UPDATES, BenchSettings

# ---- pacing -----------------------------------------------------------------------------------------


def test_a_schedule_paces_messages_at_its_rate_and_drops_what_a_starved_process_missed() -> None:
    schedule = Schedule(rate=100.0, start=0.0)
    assert schedule.due(0.0) == 1  # message 0 is due at the start
    assert schedule.due(0.005) == 0 and schedule.wait(0.005) == pytest.approx(0.005)
    assert schedule.due(0.1) == 10  # messages 1..10: one per 10 ms
    # Starved for 2 s: only the last MAX_LAG_SECONDS of slots are sent, the rest counted as dropped.
    due = schedule.due(2.1)
    assert due == pytest.approx(fanin_peers.MAX_LAG_SECONDS * 100, abs=1)
    assert schedule.dropped + due == 200 and schedule.next == 211
    assert Schedule(0.0, 0.0).due(5.0) == 0


def test_plans_split_the_actors_into_processes_that_together_offer_the_rate(tmp_path: Path) -> None:
    endpoints = {name: f"tcp://127.0.0.1:{5000 + i}" for i, name in enumerate(fanin_roles.ENDPOINTS)}
    plans = fanin.plans(endpoints, tmp_path, actors=150, rate=20_000, per_process=64)
    assert [len(p.actor_ids) for p in plans] == [64, 64, 22]
    assert sorted(i for p in plans for i in p.actor_ids) == list(range(150))
    rows = plans[0].shape.batch
    assert rows == load_config(CARTPOLE, []).actor.send_batch
    assert sum(p.messages_per_s for p in plans) * rows == pytest.approx(20_000)
    assert plans[0].heartbeat_interval == load_config(CARTPOLE, []).supervisor.heartbeat_interval


def test_the_learner_overrides_are_a_valid_config_without_ratio_or_evaluations() -> None:
    cfg = load_config(CARTPOLE, fanin_roles.learner_overrides(256))
    assert cfg.actor.num_actors == 256 and cfg.learner.samples_per_insert is None
    assert cfg.learner.eval_interval == 0 and cfg.learner.checkpoint_interval == 0
    assert cfg.supervisor.metrics_http is None  # a fixed port would collide between runs


# ---- what a subscription reads ---------------------------------------------------------------------


def test_a_weights_header_gives_its_version_and_anything_else_none() -> None:
    frames = wire.dump(WeightsMsg(Weights(7, {"w": np.zeros(3, np.float32)}), "dqn"))
    assert weights_version(frames[0]) == 7
    assert weights_version(wire.dump(StopMsg(reason="done"))[0]) is None
    assert weights_version(b"\xc1 not msgpack") is None


def test_the_publish_clock_times_each_new_version_written_to_the_version_file(tmp_path: Path) -> None:
    clock = PublishClock(tmp_path)
    if not clock.available:
        pytest.skip("no inotify on this system")
    try:
        (tmp_path / "learner-stats.json").write_text("{}")  # another file: not a publish
        fd = os.open(tmp_path / VERSION_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for version in (3, 4):  # as the learner writes it: in place, the highest version first
                before = time.monotonic()
                os.pwrite(fd, f"{version} 1002 boot".ljust(96).encode(), 0)
                wait_until(functools.partial(clock.times.__contains__, version), 10, f"version {version}")
                assert clock.times[version] >= before
        finally:
            os.close(fd)
    finally:
        clock.close()
    assert sorted(clock.times) == [3, 4]
    assert event_names(b"") == []


# ---- rates, costs, latencies -----------------------------------------------------------------------


def reading(t: float, updates: int, samples: int, learner: float, sent: int, **kw: float) -> Reading:
    # The heartbeat 0.2 s before each read; CPU in seconds used so far.
    return Reading(
        beat=t - 0.2,
        updates=updates,
        samples=samples,
        read=t,
        learner_cpu=learner,
        supervisor_cpu=kw.get("supervisor", 0.0),
        peers_cpu=kw.get("peers", 0.0),
        machine_cpu=kw.get("machine", 0.0),
        peer_counts=(sent, int(kw.get("refused", 0)), 0),
        threads={"main": learner * 0.75, "zmq": learner * 0.25},
    )


def test_intervals_give_rates_and_the_learners_cpu_per_update_and_whole_window_cores() -> None:
    readings = [
        reading(10.0, 1000, 50_000, 5.0, 40_000),
        reading(11.0, 1500, 70_000, 6.0, 60_000, supervisor=0.01, machine=1.5),
        reading(11.0, 1500, 70_000, 6.0, 60_000, supervisor=0.01, machine=1.5),  # the same beat twice
        reading(12.0, 2000, 90_000, 7.0, 80_000, supervisor=0.02, peers=0.4, machine=3.0, refused=3),
    ]
    m = intervals(readings)
    assert m.updates == pytest.approx([500.0, 500.0]) and m.received == pytest.approx([20_000.0] * 2)
    assert m.sent == pytest.approx([20_000.0] * 2)
    assert m.learner_cores == pytest.approx([1.0, 1.0])
    assert m.learner_cost == pytest.approx([2.0, 2.0])  # 1 CPU-s/s over 500 updates/s
    assert m.extra["supervisor_cores"] == pytest.approx(0.01) and m.supervisor_cores == [
        m.extra["supervisor_cores"]
    ]
    assert m.extra["peers_cores"] == pytest.approx(0.2) and m.extra["machine_busy_cores"] == pytest.approx(
        1.5
    )
    assert m.extra["refused_in_window"] == 3
    assert m.extra["learner_zmq_thread_share"] == pytest.approx(0.25)
    assert intervals(readings[:1]).updates == []


def report(actor_ids: tuple[int, ...], arrivals: list[tuple[int, int, float]]) -> PeerReport:
    return PeerReport(
        actor_ids,
        arrival_actor=np.array([a for a, _, _ in arrivals], np.int64),
        arrival_version=np.array([v for _, v, _ in arrivals], np.int64),
        arrival_time=np.array([t for _, _, t in arrivals], np.float64),
    )


def test_latencies_count_publish_to_arrival_and_spread_of_versions_published_in_the_window() -> None:
    # Versions 2 and 3 published at 10.0 and 10.5; version 1 before the window, 9 after it.
    published = {1: 9.0, 2: 10.0, 3: 10.5, 9: 20.0}
    reports = [
        report((0, 1), [(0, 1, 9.001), (0, 2, 10.002), (1, 2, 10.004), (0, 3, 10.501), (1, 3, 10.503)]),
        report((2,), [(2, 2, 10.010), (2, 9, 20.001)]),  # actor 2 missed version 3
    ]
    publish, spread, figures = latencies(reports, published, start=10.0, end=11.0)
    assert len(publish) == 1 and len(spread) == 1  # one bin of SAMPLE_SECONDS
    delays = [2, 4, 10, 1, 3]
    assert publish[0] == pytest.approx(np.percentile(delays, 95), abs=1e-6)
    assert spread[0] == pytest.approx(np.percentile([0, 2, 8, 0, 2], 95), abs=1e-6)
    assert figures["versions"] == 2 and figures["delivered_share"] == pytest.approx(5 / 6)
    # Without publish times (no version file seen): spread only, versions placed by first arrival.
    publish, spread, figures = latencies(reports, {}, start=10.0, end=11.0)
    assert publish == [] and spread and "publish_p50_ms" not in figures
    assert latencies([], published, 10.0, 11.0) == ([], [], {})


def measured(updates: float, cost: float, publish: float, supervisor: float) -> fanin_stats.Measured:
    m = fanin_stats.Measured(
        updates=[updates], received=[19_000.0], learner_cost=[cost], learner_cores=[1.0], sent=[100_000.0]
    )
    m.publish_p95, m.spread_p95 = [publish], [publish / 2]
    m.extra.update(supervisor_cores=supervisor, peers_cores=0.1, machine_busy_cores=1.9, publish_clock=1.0)
    return m


def test_rows_stand_each_count_beside_one_actor_and_ingest_beside_the_offered_rate() -> None:
    rows = fanin.rows(20_000, {1: measured(500, 2.0, 1.0, 0.01), 64: measured(400, 2.2, 10.0, 0.05)})
    by_name = {r.name: r for r in rows}
    one = "20,000 transitions/s offered, 1 simulated actor"
    many = "20,000 transitions/s offered, 64 simulated actors"
    assert by_name[f"{many}: learner updates/s"].ratio == pytest.approx(0.8)
    assert by_name[f"{many}: learner CPU per 1,000 updates"].unit == CPU_PER_UPDATES
    assert by_name[f"{many}: learner CPU per 1,000 updates"].ratio == pytest.approx(1.1)
    assert by_name[f"{many}: weights publish to arrival, p95"].ratio == pytest.approx(10.0)
    assert by_name[f"{many}: supervisor CPU"].ratio == pytest.approx(5.0)
    assert by_name[f"{one}: ingest, received vs offered"].ratio == pytest.approx(0.95)
    assert by_name[f"{one}: learner updates/s"].reference is None  # the base has nothing beside it
    assert f"{one}: weights arrival spread, p95" not in by_name  # zero by definition with one subscriber
    assert all(r.group == "fanin" and "simulated actor" in r.notes for r in rows)
    # One paced connection that could not carry the rate is no base: the fewest actors that could are.
    short = measured(450, 2.5, 1.0, 0.01)
    short.sent = [41_000.0]
    rows = fanin.rows(
        100_000, {1: short, 8: measured(300, 3.0, 4.0, 0.01), 64: measured(330, 3.3, 12.0, 0.02)}
    )
    by_name = {r.name: r for r in rows}
    assert fanin.base_count(100_000, {1: short}) == 1
    assert by_name["100,000 transitions/s offered, 1 simulated actor: learner updates/s"].reference is None
    assert by_name["100,000 transitions/s offered, 8 simulated actors: learner updates/s"].reference is None
    assert by_name[
        "100,000 transitions/s offered, 64 simulated actors: learner updates/s"
    ].ratio == pytest.approx(1.1)


# ---- the parts, registered and run -----------------------------------------------------------------


def test_fanin_and_mlp_are_parts_of_zmqrl_bench() -> None:
    assert {"fanin", "mlp"} <= set(cli.PARTS)
    assert cli.load_part("fanin") is fanin and cli.load_part("mlp") is mlp
    assert fanin.SECONDS[1] < fanin.SECONDS[0] and mlp.SECONDS[1] < mlp.SECONDS[0]


def test_the_mlp_part_puts_the_device_row_beside_the_cpu_core(monkeypatch: pytest.MonkeyPatch) -> None:
    tiny = BenchSettings(quick=True, repeats=1, seconds=0.05, device="cpu")
    alone = mlp.run(tiny)  # no GPU: the CPU rows alone
    assert [r.unit for r in alone] == ["updates/s", CPU_PER_UPDATES]
    assert all(r.group == "mlp" and r.reference is None for r in alone)
    monkeypatch.setattr(mlp, "on_gpu", lambda device: True)  # the GPU path, measured on the CPU
    rows = mlp.run(tiny)
    device_rows = rows[2:]
    assert [r.unit for r in device_rows] == ["updates/s", CPU_PER_UPDATES]
    assert device_rows[0].reference == rows[0].ours and device_rows[0].target == mlp.TARGET
    assert device_rows[1].target is None and "one CPU core" in device_rows[0].notes


@pytest.mark.slow  # a real supervisor and learner: about 12 s on 2 busy cores
def test_the_fanin_part_measures_a_real_learner_and_supervisor_and_leaves_nothing_running(
    run_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[int] = []
    real_start = fanin_peers.Peers.start

    def recording_start(self: fanin_peers.Peers) -> None:
        real_start(self)
        started.extend(self.pids)

    monkeypatch.setattr(fanin_peers.Peers, "start", recording_start)
    rows = fanin.run(BenchSettings.make(True), counts=(2,), per_process=1, run_root=run_root)
    by_name = {r.name.split(": ", 1)[1]: r for r in rows}
    assert {
        "learner updates/s",
        "learner CPU per 1,000 updates",
        "ingest, received vs offered",
        "weights arrival spread, p95",
        "supervisor CPU",
        "learner CPU",
    } <= set(by_name)
    assert all(r.name.startswith("20,000 transitions/s offered, 2 simulated actors: ") for r in rows)
    assert by_name["learner updates/s"].ours.median > 0
    ingest = by_name["ingest, received vs offered"]
    assert ingest.ours.median > 0 and ingest.reference is not None and ingest.reference.median == 20_000
    assert 0 < by_name["learner CPU per 1,000 updates"].ours.median < 100
    assert by_name["weights arrival spread, p95"].ours.median >= 0
    extra = by_name["learner updates/s"].extra
    assert extra["peer_processes"] == 2 and extra["versions"] > 0 and extra["delivered_share"] > 0.5
    assert extra["sent"] > 0 and all(r.ours.min >= 0 for r in rows)
    assert len(started) == 2  # one process per simulated actor here
    assert not [pid for pid in started if Path(f"/proc/{pid}").exists()], "simulated actors left running"
    assert processes_mentioning(str(run_root)) == []
