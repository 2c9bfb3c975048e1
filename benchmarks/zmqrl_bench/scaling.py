"""Scaling on this machine: what 1, 2, 4 and 8 uncapped actors and one learner do together, and
what ingest takes from 32 synthetic senders.

Each actor count is a real run, exactly what ``zmqrl launch configs/cartpole_dqn.yaml`` starts
(``zmqrl.api.train`` in processes mode: a supervisor here, the learner and actors as OS
processes), with uncapped actors, no evaluations and no checkpoints during the run, ending on
``learner.max_seconds``. While it runs, a thread asks the supervisor for its status, as
``zmqrl status`` does, every STATUS_INTERVAL: the learner's counters (updates, transitions
received) as of its latest heartbeat, timed by that heartbeat's age. Steady state starts
WARMUP_SECONDS after every actor is up and training has begun; the rates between successive
heartbeats from then on are the values whose median, min and max the table shows. Total actor
transitions/s is what the learner received. These are plain measurements: on 2 cores, more
actors mostly compete with the learner for the same CPUs.

What each sample costs: at every status answer the sampler also reads the CPU time the kernel
charged the learner and the actors so far (:mod:`zmqrl_bench.cpu`, all threads); between two
heartbeats, the CPU seconds the learner used per second over its updates per second is its
CPU-seconds per 1,000 updates, and the actors' (added up) over the transitions received per
second, theirs per 1,000 env steps (CartPole DQN: one env per actor, one transition per step).
The supervisor (this process) is in neither.

``--actors`` gives the counts (``settings.actors``), ``--device`` the learner's device for these
runs and for the convolutional learners' rows that follow (:mod:`zmqrl_bench.cnn_learner`).
"""

from __future__ import annotations

import io
import itertools
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import zmq

from zmqrl_bench import cnn_learner
from zmqrl_bench.actor import CARTPOLE
from zmqrl_bench.cpu import per_thousand, process_cpu_seconds, total_cpu_seconds
from zmqrl_bench.ingest import cases, measure
from zmqrl_bench.report import CPU_PER_STEPS, CPU_PER_UPDATES, BenchSettings, Comparison, Stat

SECONDS = (100 + cnn_learner.SECONDS[0], 25 + cnn_learner.SECONDS[1])
ACTOR_COUNTS = (1, 2, 4, 8)
QUICK_ACTOR_COUNTS = (2,)  # start-up dominates: one run (~15 s on a busy 2-core machine)
# Training seconds per run (learner.max_seconds): a base, plus per actor (they start one by one).
RUN_SECONDS = (6.0, 4.0)
RUN_SECONDS_PER_ACTOR = 0.5
# Seconds between status requests, and after all actors are up before steady state counts.
STATUS_INTERVAL = 0.5
WARMUP_SECONDS = 1.0
SYNTHETIC_SENDERS = 32
# Quick: fewer (starting 32 processes on 2 cores alone takes 10-25 s).
QUICK_SENDERS = 8


def run_overrides(run_dir: Path, actors: int, seconds: float, device: str | None = None) -> dict[str, object]:
    endpoints = ("samples", "weights", "heartbeat", "control")
    return {
        **({} if device is None else {"agent.device": device}),
        "run.dir": str(run_dir),
        "run.name": f"actors-{actors}",
        "actor.num_actors": actors,
        "actor.max_steps_per_s": None,
        "learner.samples_per_insert": None,  # throughput as such: no replay ratio holding actors back
        "transport.samples_hwm": 64,  # and the default queues (the shipped config keeps one message)
        "transport.samples_buffer_kb": 0,
        "learner.max_seconds": seconds,
        "learner.max_updates": 10**9,
        "learner.eval_interval": 0,  # only the one at the end, after what is measured
        "learner.eval_episodes": 1,
        "learner.checkpoint_interval": 0,
        "learner.target_return": None,
        "learner.stop_at_target": False,
        **{f"transport.{name}": "tcp://127.0.0.1:0" for name in endpoints},
    }


@dataclass(frozen=True)
class Point:
    """The learner's counters as of one heartbeat (``time``: monotonic, when it was sent), and
    the CPU seconds the learner and the actors had used when it was read (``read``; None where
    /proc could not tell), with the processes' ids (a restart is a new process)."""

    time: float
    updates: int
    samples: int
    actors_alive: int
    read: float = 0.0
    learner_cpu: float | None = None
    actors_cpu: float | None = None
    pids: tuple[int, ...] = ()


def _steady(points: list[Point], actors: int, warmup: float) -> list[tuple[Point, Point]]:
    """Successive heartbeats from ``warmup`` seconds after the first one that saw all ``actors``
    up and training begun (the same heartbeat seen twice is not an interval)."""
    began = next((p.time for p in points if p.actors_alive >= actors and p.updates > 0), None)
    steady = [p for p in points if began is not None and p.time >= began + warmup]
    return [(a, b) for a, b in itertools.pairwise(steady) if b.time - a.time > 0.05]


def steady_rates(points: list[Point], actors: int, warmup: float = WARMUP_SECONDS) -> dict[str, list[float]]:
    """Updates/s and transitions/s between successive heartbeats in steady state."""
    rates: dict[str, list[float]] = {"updates": [], "samples": []}
    for a, b in _steady(points, actors, warmup):
        dt = b.time - a.time
        rates["updates"].append((b.updates - a.updates) / dt)
        rates["samples"].append((b.samples - a.samples) / dt)
    return rates


def _cost(
    cpu_a: float | None, cpu_b: float | None, dt_read: float, done: int, dt_beat: float
) -> float | None:
    """CPU seconds per 1,000 of what was ``done``: the CPU rate between two reads over the
    throughput between the two heartbeats (each on its own clock; in steady state both rates
    describe the same seconds)."""
    if cpu_a is None or cpu_b is None or dt_read <= 0 or dt_beat <= 0:
        return None
    return per_thousand((cpu_b - cpu_a) / dt_read, done / dt_beat)


def steady_costs(points: list[Point], actors: int, warmup: float = WARMUP_SECONDS) -> dict[str, list[float]]:
    """The learner's CPU seconds per 1,000 updates and the actors' per 1,000 transitions, between
    successive heartbeats in steady state where the same processes were read at both ends."""
    costs: dict[str, list[float]] = {"learner": [], "actors": []}
    for a, b in _steady(points, actors, warmup):
        if a.pids != b.pids or not a.pids:
            continue
        dt_read, dt_beat = b.read - a.read, b.time - a.time
        for key, cost in (
            ("learner", _cost(a.learner_cpu, b.learner_cpu, dt_read, b.updates - a.updates, dt_beat)),
            ("actors", _cost(a.actors_cpu, b.actors_cpu, dt_read, b.samples - a.samples, dt_beat)),
        ):
            if cost is not None:
                costs[key].append(cost)
    return costs


class StatusSampler:
    """Asks the run's supervisor for its snapshot until ``stop()``; keeps one Point per heartbeat."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.points: list[Point] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-status", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from zmqrl.supervisor.status import StatusClient, StatusError, StatusRecord

        record = None
        while record is None and not self._stop.wait(0.1):
            try:
                record = StatusRecord.read(self.run_dir)
            except StatusError:  # being written
                continue
        if record is None:
            return
        ctx = zmq.Context()
        client = StatusClient(record.endpoint, ctx=ctx)
        try:
            while not self._stop.wait(STATUS_INTERVAL):
                try:
                    snap = client.fetch(1.0)
                except StatusError:
                    continue
                asked = time.monotonic()
                learner = next(
                    (row for row in (snap.processes if snap else []) if row.role == "learner"), None
                )
                if snap is None or learner is None or learner.heartbeat_age is None:
                    continue
                actors = sorted(row.pid for row in snap.processes if row.role == "actor" and row.pid)
                learner_pid = [learner.pid] if learner.pid else []
                read = time.monotonic()
                point = Point(
                    asked - learner.heartbeat_age,
                    snap.updates,
                    snap.samples,
                    snap.actors_alive,
                    read=read,
                    learner_cpu=process_cpu_seconds(learner.pid) if learner.pid else None,
                    actors_cpu=total_cpu_seconds(actors) if actors else None,
                    pids=tuple(learner_pid + actors),
                )
                if not self.points or (point.updates, point.samples) != (
                    self.points[-1].updates,
                    self.points[-1].samples,
                ):
                    self.points.append(point)
        finally:
            client.close()
            ctx.term()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@dataclass(frozen=True)
class RunRates:
    """What one run measured: per-interval values, and whether they are steady state (False: too
    short a run; rates are then the whole run's averages, costs from every interval with updates)."""

    updates: list[float]
    samples: list[float]
    steady: bool
    learner_cost: list[float]  # CPU-s per 1,000 updates
    actors_cost: list[float]  # CPU-s per 1,000 env steps, all actors together


def measure_run(run_root: Path, actors: int, seconds: float, device: str | None = None) -> RunRates:
    """One real run with ``actors`` actors, measured from its supervisor's status answers."""
    from zmqrl.api import train

    overrides = run_overrides(run_root, actors, seconds, device)
    sampler = StatusSampler(run_root / f"actors-{actors}")
    try:
        result = train(CARTPOLE, mode="processes", overrides=overrides, out=io.StringIO())
    finally:
        sampler.stop()
    rates = steady_rates(sampler.points, actors)
    costs = steady_costs(sampler.points, actors)
    if rates["updates"]:
        return RunRates(rates["updates"], rates["samples"], True, costs["learner"], costs["actors"])
    costs = steady_costs(sampler.points, 0, warmup=0.0)
    return RunRates(
        [float(result.learner["updates_per_s"])],
        [float(result.learner["samples_per_s"])],
        False,
        costs["learner"],
        costs["actors"],
    )


def run_rows(actors: int, seconds: float, measured: RunRates) -> list[Comparison]:
    """One run's rows: transitions/s, updates/s, then what they cost in CPU (where measured)."""
    plural = "s" if actors > 1 else ""
    how = "steady state, between learner heartbeats" if measured.steady else "whole run (too short)"
    notes = f"zmqrl launch, {seconds:g} s of training, {how}"
    extra = {"steady": float(measured.steady), "learner_max_seconds": seconds}
    rows = []
    for unit, values, what, better in (
        ("transitions/s", measured.samples, "total actor transitions", True),
        ("updates/s", measured.updates, "learner updates", True),
        (CPU_PER_STEPS, measured.actors_cost, "actors' CPU per 1,000 env steps", False),
        (CPU_PER_UPDATES, measured.learner_cost, "learner CPU per 1,000 updates", False),
    ):
        if values:
            name = f"CartPole, {actors} uncapped actor{plural}: {what}"
            rows.append(
                Comparison(
                    "scaling",
                    name,
                    unit,
                    Stat.of(values),
                    None,
                    higher_is_better=better,
                    notes=notes,
                    extra=extra,
                )
            )
    return rows


def run(
    settings: BenchSettings,
    *,
    actor_counts: tuple[int, ...] | None = None,
    senders: int | None = None,
    run_root: Path | None = None,
    learners: bool = True,
) -> list[Comparison]:
    """Plain rows: per actor count (``actor_counts``, else ``settings.actors``, else the part's
    own), transitions/s, updates/s and their CPU costs; the senders' ingest; then (``learners``)
    the convolutional learners' updates/s on ``settings.device``. Runs go to ``run_root``
    (default: a temporary directory, removed after)."""
    senders = senders or (QUICK_SENDERS if settings.quick else SYNTHETIC_SENDERS)
    counts = actor_counts or settings.actors or (QUICK_ACTOR_COUNTS if settings.quick else ACTOR_COUNTS)
    base = RUN_SECONDS[1 if settings.quick else 0]
    results = []
    with tempfile.TemporaryDirectory(prefix="zmqrl-bench-") as tmp:
        for actors in counts:
            seconds = base + RUN_SECONDS_PER_ACTOR * actors
            measured = measure_run(run_root or Path(tmp), actors, seconds, settings.device)
            results += run_rows(actors, seconds, measured)
    ctx = zmq.Context()
    try:
        cartpole = cases()[0]
        ours, _ = measure(ctx, cartpole, senders, settings.repeats, settings.seconds / 2, reference=False)
    finally:
        ctx.term()
    results.append(
        Comparison(
            group="scaling",
            name=f"ingest from {senders} synthetic senders ({cartpole.label})",
            unit="transitions/s",
            ours=Stat.of(ours),
            reference=None,
            notes="SampleReceiver + Ingest.drain into replay, as the ingest bench",
        )
    )
    if learners:
        results += cnn_learner.run(settings)
    return results
