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

from zmqrl.bench.actor import CARTPOLE
from zmqrl.bench.ingest import cases, measure
from zmqrl.bench.report import BenchSettings, Comparison, Stat

SECONDS = (100, 25)
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


def run_overrides(run_dir: Path, actors: int, seconds: float) -> dict[str, object]:
    endpoints = ("samples", "weights", "heartbeat", "control")
    return {
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
    """The learner's counters as of one heartbeat (``time``: monotonic, when it was sent)."""

    time: float
    updates: int
    samples: int
    actors_alive: int


def steady_rates(points: list[Point], actors: int, warmup: float = WARMUP_SECONDS) -> dict[str, list[float]]:
    """Updates/s and transitions/s between successive heartbeats, from ``warmup`` seconds after
    the first one that saw all ``actors`` up and training begun."""
    began = next((p.time for p in points if p.actors_alive >= actors and p.updates > 0), None)
    steady = [p for p in points if began is not None and p.time >= began + warmup]
    rates: dict[str, list[float]] = {"updates": [], "samples": []}
    for a, b in itertools.pairwise(steady):
        dt = b.time - a.time
        if dt > 0.05:  # the same heartbeat seen twice is not an interval
            rates["updates"].append((b.updates - a.updates) / dt)
            rates["samples"].append((b.samples - a.samples) / dt)
    return rates


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
                point = Point(asked - learner.heartbeat_age, snap.updates, snap.samples, snap.actors_alive)
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


def measure_run(run_root: Path, actors: int, seconds: float) -> tuple[list[float], list[float], bool]:
    """Steady-state (updates/s, transitions/s) values of one real run with ``actors`` actors, and
    whether they are steady-state (False: too short a run, the whole run's averages instead)."""
    from zmqrl.api import train

    overrides = run_overrides(run_root, actors, seconds)
    sampler = StatusSampler(run_root / f"actors-{actors}")
    try:
        result = train(CARTPOLE, mode="processes", overrides=overrides, out=io.StringIO())
    finally:
        sampler.stop()
    rates = steady_rates(sampler.points, actors)
    if rates["updates"]:
        return rates["updates"], rates["samples"], True
    return [float(result.learner["updates_per_s"])], [float(result.learner["samples_per_s"])], False


def run(
    settings: BenchSettings,
    *,
    actor_counts: tuple[int, ...] | None = None,
    senders: int | None = None,
    run_root: Path | None = None,
) -> list[Comparison]:
    """Plain rows: transitions/s and updates/s per actor count, then the senders' ingest. Runs go
    to ``run_root`` (default: a temporary directory, removed after)."""
    senders = senders or (QUICK_SENDERS if settings.quick else SYNTHETIC_SENDERS)
    counts = actor_counts or (QUICK_ACTOR_COUNTS if settings.quick else ACTOR_COUNTS)
    base = RUN_SECONDS[1 if settings.quick else 0]
    results = []
    with tempfile.TemporaryDirectory(prefix="zmqrl-bench-") as tmp:
        for actors in counts:
            seconds = base + RUN_SECONDS_PER_ACTOR * actors
            updates, samples, steady = measure_run(run_root or Path(tmp), actors, seconds)
            plural = "s" if actors > 1 else ""
            how = "steady state, between learner heartbeats" if steady else "whole-run average (too short)"
            for unit, values, what in (
                ("transitions/s", samples, "total actor transitions"),
                ("updates/s", updates, "learner updates"),
            ):
                results.append(
                    Comparison(
                        group="scaling",
                        name=f"CartPole, {actors} uncapped actor{plural}: {what}",
                        unit=unit,
                        ours=Stat.of(values),
                        reference=None,
                        notes=f"zmqrl launch, {seconds:g} s of training, {how}",
                        extra={"steady": float(steady), "learner_max_seconds": seconds},
                    )
                )
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
    return results
