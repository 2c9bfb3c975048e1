"""Fan-in and fan-out at a fixed total rate: what N actors cost a real learner and supervisor when
together they offer exactly what one actor would.

For each offered rate and each N, a fresh watch-only supervisor and learner are started by their
command lines (:mod:`zmqrl_bench.fanin_roles`: configs/cartpole_dqn.yaml, no replay ratio and no
ingest budget, no evaluations or checkpoints while measuring, the control plane authenticated),
then N simulated actors in processes of up to ACTORS_PER_PROCESS (:mod:`zmqrl_bench.fanin_peers`):
each with its own samples socket, weights subscription, signed heartbeats and control
subscription, all paced so that together they offer the same transitions/s whatever N. What
changes with N is only what a real deployment adds per actor: connections, heartbeats, weights
copies. Once every actor is up and the learner trains, WARMUP seconds pass, then the window is
read every SAMPLE_SECONDS:

- learner updates/s and ingest (transitions/s received), from the learner's counters in the
  supervisor's status answers, timed by the learner's heartbeat;
- learner CPU-s per 1,000 updates: the CPU time /proc charged the learner process (all threads)
  and any process it started, per second, over its updates/s; its ZeroMQ I/O threads' share of it;
- the supervisor's CPU seconds per second (heartbeats in, status and beats out);
- weights publish to arrival, p95 (each subscriber's first arrival of each version against the
  learner's write of that version, :mod:`zmqrl_bench.fanin_clock`), and the arrival spread, p95
  (each arrival against the first arrival of that version at any subscriber: the fan-out alone).

Each N's rows stand beside the fewest actors at the same rate that delivered it (N=1, unless one
paced connection could not carry the offered rate; ratio = N's median over that N's); ingest
stands beside the offered rate. On a small machine the simulated actors share the cores with the learner:
their own CPU is in the notes, to tell the learner's cost (CPU per update) from contention
(updates/s).
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from zmqrl.config import load_config
from zmqrl.runtime.link import socket_limits
from zmqrl_bench.actor import CARTPOLE
from zmqrl_bench.cpu import process_cpu_seconds, total_cpu_seconds
from zmqrl_bench.fanin_clock import PublishClock
from zmqrl_bench.fanin_peers import PeerPlan, PeerReport, Peers
from zmqrl_bench.fanin_roles import (
    Roles,
    RunPaths,
    learner_overrides,
    loopback_endpoints,
    machine_busy_seconds,
    thread_cpu_seconds,
    tree_cpu_seconds,
)
from zmqrl_bench.fanin_stats import SAMPLE_SECONDS, Measured, Reading, intervals, latencies
from zmqrl_bench.report import CPU_PER_UPDATES, BenchSettings, Comparison, Stat
from zmqrl_bench.senders import SampleShape

SECONDS = (120, 25)
# Offered transitions/s (every N at the same total), and the numbers of simulated actors.
RATES, QUICK_RATES = (20_000, 100_000), (20_000,)
COUNTS, QUICK_COUNTS = (1, 8, 64, 256), (1, 8)
# Simulated actors per process (256 actors: 4 processes).
ACTORS_PER_PROCESS = 64
# Seconds after every actor is up and training began, then of measurement (full, quick).
WARMUP = (2.0, 1.0)
WINDOW = (6.0, 3.0)
# How long every actor may take to be seen and the learner to begin training.
READY_TIMEOUT = 120.0
# The base of the ratios is the fewest actors that sent at least this share of the offered rate.
DELIVERED_SHARE = 0.9
# The CPU-s/s unit of the supervisor's row: cores kept busy.
CORES = "CPU-s/s"


def plans(
    endpoints: dict[str, str], keys_dir: Path, actors: int, rate: float, per_process: int
) -> list[PeerPlan]:
    """The processes of ``actors`` simulated actors (ids 0..actors-1) offering ``rate``
    transitions/s together, each process its share."""
    cfg = load_config(CARTPOLE, [])
    shape = SampleShape(batch=cfg.actor.send_batch)
    per_actor = rate / shape.batch / actors
    groups = [tuple(range(i, min(i + per_process, actors))) for i in range(0, actors, per_process)]
    return [
        PeerPlan(
            samples=endpoints["samples"],
            weights=endpoints["weights"],
            heartbeat=endpoints["heartbeat"],
            control=endpoints["control"],
            keys_dir=str(keys_dir),
            actor_ids=ids,
            messages_per_s=per_actor * len(ids),
            heartbeat_interval=cfg.supervisor.heartbeat_interval,
            limits=socket_limits(cfg),
            shape=shape,
        )
        for ids in groups
    ]


def _reading(roles: Roles, peers: Peers, supervisor_pid: int, learner_pid: int) -> Reading | None:
    asked = time.monotonic()
    snap = roles.status()
    row = next(
        (r for r in (snap.processes if snap else []) if r.role == "learner" and r.pid == learner_pid), None
    )
    if snap is None or row is None or row.heartbeat_age is None:
        return None
    return Reading(
        beat=asked - row.heartbeat_age,
        updates=snap.updates,
        samples=snap.samples,
        read=time.monotonic(),
        learner_cpu=tree_cpu_seconds(learner_pid),
        supervisor_cpu=process_cpu_seconds(supervisor_pid),
        peers_cpu=total_cpu_seconds(peers.pids),
        machine_cpu=machine_busy_seconds(),
        peer_counts=peers.counts(),
        threads=thread_cpu_seconds(learner_pid),
    )


def _wait_ready(roles: Roles, actors: int) -> None:
    """Until the supervisor sees every simulated actor alive and the learner has trained."""
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        for role in (roles.supervisor, roles.learner):
            if role is not None:
                role.check_alive()
        snap = roles.status()
        if snap is not None and snap.actors_alive >= actors and snap.updates > 0:
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"the learner did not train with {actors} simulated actors up within {READY_TIMEOUT:g} s"
    )


def measure(
    root: Path,
    rate: int,
    actors: int,
    quick: bool,
    per_process: int = ACTORS_PER_PROCESS,
    overrides: Sequence[str] = (),
) -> Measured:
    """One fresh supervisor and learner, ``actors`` simulated actors offering ``rate``
    transitions/s, measured over the window; ``overrides`` (``--set`` values) after the bench's."""
    paths = RunPaths(root, f"fanin-{rate}-{actors}")
    endpoints = loopback_endpoints()
    roles = Roles(CARTPOLE, paths, endpoints, [*learner_overrides(actors), *overrides])
    clock: PublishClock | None = None
    peers: Peers | None = None
    reports: list[PeerReport] = []
    readings: list[Reading] = []
    try:
        roles.start()
        assert roles.supervisor is not None and roles.learner is not None
        clock = PublishClock(paths.run_dir)
        peers = Peers(plans(endpoints, paths.keys_dir, actors, rate, per_process))
        peers.start()
        _wait_ready(roles, actors)
        time.sleep(WARMUP[1 if quick else 0])  # a measurement window, not a wait on a condition
        start = time.monotonic()
        end = start + WINDOW[1 if quick else 0]
        while time.monotonic() < end + 1e-3:
            reading = _reading(roles, peers, roles.supervisor.pid, roles.learner.pid)
            if reading is not None and (not readings or reading.beat != readings[-1].beat):
                readings.append(reading)
            time.sleep(max(0.0, min(SAMPLE_SECONDS, end - time.monotonic() + 1e-3)))
        roles.learner.check_alive()
        reports = peers.stop()
        peers = None
    finally:
        if peers is not None:
            peers.stop()
        if clock is not None:
            clock.close()
        roles.close()
    measured = intervals(readings)
    publish, spread, figures = latencies(reports, clock.times if clock else {}, start, end)
    measured.publish_p95, measured.spread_p95 = publish, spread
    measured.extra.update(figures)
    measured.extra.update(
        publish_clock=float(bool(clock and clock.times)),
        peer_processes=float(len(reports)),
    )
    return measured


def _median(values: Sequence[float]) -> float:
    return float(np.median(values)) if values else math.nan


def notes_for(rate: int, actors: int, m: Measured) -> str:
    """What a row's numbers stand on: the simulated actors' real rate and CPU, the machine's load."""
    plural = "s" if actors > 1 else ""
    sent = _median(m.sent)
    notes = (
        f"zmqrl learner + zmqrl supervise, {actors} simulated actor{plural} in "
        f"{int(m.extra.get('peer_processes', 0))} process(es) sending {sent:,.0f} transitions/s "
        f"({sent / rate:.0%} of offered; {int(m.extra.get('refused_in_window', 0))} messages refused, "
        f"{int(m.extra.get('dropped_in_window', 0))} dropped behind schedule) on "
        f"{m.extra.get('peers_cores', math.nan):.2f} cores; the machine "
        f"{m.extra.get('machine_busy_cores', math.nan):.2f} cores busy; readings every {SAMPLE_SECONDS:g} s"
    )
    if not m.extra.get("publish_clock"):
        notes += "; no publish times (weights-version file not seen): arrival spread only"
    return notes


def base_count(rate: int, results: dict[int, Measured]) -> int:
    """The N the others stand beside: the fewest actors whose processes sent at least
    DELIVERED_SHARE of the offered rate (one paced connection may not carry it all), else the
    fewest measured."""
    delivered = [n for n, m in sorted(results.items()) if _median(m.sent) >= DELIVERED_SHARE * rate]
    return delivered[0] if delivered else min(results)


def rows(rate: int, results: dict[int, Measured]) -> list[Comparison]:
    """The rows of one rate: per N, beside the base N (:func:`base_count`) at that rate (ingest
    beside the offered rate; the arrival spread, zero with one subscriber, stands alone)."""
    out: list[Comparison] = []
    first = base_count(rate, results)
    base = results[first]
    for actors, m in results.items():
        plural = "s" if actors > 1 else ""
        label = f"{rate:,} transitions/s offered, {actors} simulated actor{plural}"
        notes = notes_for(rate, actors, m)
        extra = {**m.extra, "offered": float(rate), "actors": float(actors), "sent": _median(m.sent)}
        offered = [float(rate)]
        specs: tuple[tuple[str, str, list[float], list[float], bool], ...] = (
            ("learner updates/s", "updates/s", m.updates, base.updates if base else [], True),
            (
                "learner CPU per 1,000 updates",
                CPU_PER_UPDATES,
                m.learner_cost,
                base.learner_cost if base else [],
                False,
            ),
            ("ingest, received vs offered", "transitions/s", m.received, offered, True),
            ("weights publish to arrival, p95", "ms", m.publish_p95, base.publish_p95 if base else [], False),
            ("weights arrival spread, p95", "ms", m.spread_p95 if actors > 1 else [], [], False),
            ("supervisor CPU", CORES, m.supervisor_cores, base.supervisor_cores if base else [], False),
            ("learner CPU", CORES, m.learner_cores, base.learner_cores if base else [], False),
        )
        for what, unit, values, against, better in specs:
            if not values:
                continue
            beside = against and (against is offered or actors > first)
            out.append(
                Comparison(
                    group="fanin",
                    name=f"{label}: {what}",
                    unit=unit,
                    ours=Stat.of(values),
                    reference=Stat.of(against) if beside else None,
                    higher_is_better=better,
                    notes=notes,
                    extra=extra,
                )
            )
    return out


def run(
    settings: BenchSettings,
    *,
    counts: Sequence[int] | None = None,
    rates: Sequence[int] | None = None,
    run_root: Path | None = None,
    per_process: int = ACTORS_PER_PROCESS,
    overrides: Sequence[str] = (),
) -> list[Comparison]:
    """Every rate (``rates``, else the part's own) at every N (``counts``), each a fresh run under
    ``run_root`` (default: a temporary directory, removed after), the learner on
    ``settings.device`` when given, with ``overrides`` last (e.g. the shipped ingest budget back:
    ``learner.ingest_max_share=0.05``)."""
    counts = tuple(counts or (QUICK_COUNTS if settings.quick else COUNTS))
    rates = tuple(rates or (QUICK_RATES if settings.quick else RATES))
    device = [] if settings.device is None else [f"agent.device={settings.device}"]
    out: list[Comparison] = []
    with tempfile.TemporaryDirectory(prefix="zmqrl-fanin-") as tmp:
        root = run_root or Path(tmp)
        for rate in rates:
            results = {
                actors: measure(root, rate, actors, settings.quick, per_process, [*device, *overrides])
                for actors in counts
            }
            out += rows(rate, results)
    return out
