"""What the fan-in benchmark computes from its readings: rates and CPU costs between readings of
one window, and the weights latencies from the simulated actors' arrivals (pure functions, so the
arithmetic is tested apart from the processes that produce the numbers; see
:mod:`zmqrl_bench.fanin` for what is measured and how).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from zmqrl_bench.cpu import per_thousand
from zmqrl_bench.fanin_peers import PeerReport

# Seconds between readings in a window; publish latencies are binned by this too.
SAMPLE_SECONDS = 1.0


@dataclass(frozen=True)
class Reading:
    """One reading of the window: the learner's counters as of its latest heartbeat (``beat``:
    monotonic, when it was sent), and at ``read`` the CPU seconds used so far (the learner's with
    its processes and per thread group, the supervisor's, the simulated actors', the whole
    machine's) and the simulated actors' counts (transitions sent, messages refused, dropped)."""

    beat: float
    updates: int
    samples: int
    read: float
    learner_cpu: float | None
    supervisor_cpu: float | None
    peers_cpu: float | None
    machine_cpu: float | None
    peer_counts: tuple[int, int, int] = (0, 0, 0)
    threads: dict[str, float] = field(default_factory=dict)


@dataclass
class Measured:
    """What one (rate, N) run measured: values per interval of the window (lists), latencies per
    bin (ms), and whole-window figures in ``extra`` (CPU-s/s of the supervisor, the simulated
    actors and the machine: tick-counted CPU is too coarse for one-second intervals)."""

    updates: list[float] = field(default_factory=list)
    received: list[float] = field(default_factory=list)
    learner_cost: list[float] = field(default_factory=list)
    learner_cores: list[float] = field(default_factory=list)
    sent: list[float] = field(default_factory=list)
    publish_p95: list[float] = field(default_factory=list)
    spread_p95: list[float] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def supervisor_cores(self) -> list[float]:
        return [self.extra["supervisor_cores"]] if "supervisor_cores" in self.extra else []


def _per_second(first: float | None, last: float | None, seconds: float) -> float | None:
    return None if first is None or last is None or seconds <= 0 else (last - first) / seconds


def intervals(readings: Sequence[Reading]) -> Measured:
    """Rates and costs between successive readings (the same heartbeat read twice is skipped), and
    the whole window's CPU-s/s and counts."""
    out = Measured()
    pairs = [(a, b) for a, b in itertools.pairwise(readings) if b.beat - a.beat > 0.05 and b.read > a.read]
    for a, b in pairs:
        beat, read = b.beat - a.beat, b.read - a.read
        updates = (b.updates - a.updates) / beat
        out.updates.append(updates)
        out.received.append((b.samples - a.samples) / beat)
        out.sent.append((b.peer_counts[0] - a.peer_counts[0]) / read)
        cores = _per_second(a.learner_cpu, b.learner_cpu, read)
        if cores is not None:
            out.learner_cores.append(cores)
            cost = per_thousand(cores, updates)
            if cost is not None:
                out.learner_cost.append(cost)
    if len(readings) < 2:
        return out
    first, last = readings[0], readings[-1]
    seconds = last.read - first.read
    for key, at_start, at_end in (
        ("supervisor_cores", first.supervisor_cpu, last.supervisor_cpu),
        ("peers_cores", first.peers_cpu, last.peers_cpu),
        ("machine_busy_cores", first.machine_cpu, last.machine_cpu),
    ):
        value = _per_second(at_start, at_end, seconds)
        if value is not None:
            out.extra[key] = value
    out.extra["refused_in_window"] = float(last.peer_counts[1] - first.peer_counts[1])
    out.extra["dropped_in_window"] = float(last.peer_counts[2] - first.peer_counts[2])
    if first.threads and last.threads:
        spent = {k: last.threads[k] - first.threads.get(k, 0.0) for k in last.threads}
        total = sum(spent.values())
        if total > 0:
            out.extra.update({f"learner_{k}_thread_share": v / total for k, v in spent.items()})
    return out


def latencies(
    reports: Sequence[PeerReport], published: dict[int, float], start: float, end: float
) -> tuple[list[float], list[float], dict[str, float]]:
    """Per bin of SAMPLE_SECONDS in [start, end): the p95 of publish to arrival (ms; empty when no
    publish time is known) and of arrival spread (ms), and figures for the notes (versions counted,
    share of version x subscriber pairs that arrived, p50s)."""
    if not reports or not any(r.arrival_version.size for r in reports):
        return [], [], {}
    actor = np.concatenate([r.arrival_actor for r in reports])
    version = np.concatenate([r.arrival_version for r in reports])
    arrival = np.concatenate([r.arrival_time for r in reports])
    subscribers = sum(len(r.actor_ids) for r in reports)
    first = {int(v): float(arrival[version == v].min()) for v in np.unique(version)}
    # When each version left the learner: its write of the version file, else its first arrival.
    known = {v: published[v] for v in first if v in published}
    origin = known if known else first
    counted = [v for v, t in origin.items() if start <= t < end]
    keep = np.isin(version, counted)
    if not keep.any():
        return [], [], {}
    version, arrival, actor = version[keep], arrival[keep], actor[keep]
    sent = np.array([origin[int(v)] for v in version])
    spread = arrival - np.array([first[int(v)] for v in version])
    delay = arrival - sent
    bins = ((sent - start) // SAMPLE_SECONDS).astype(np.int64)
    publish_p95, spread_p95 = [], []
    for b in np.unique(bins):
        inside = bins == b
        spread_p95.append(float(np.percentile(spread[inside], 95)) * 1000)
        if known:
            publish_p95.append(float(np.percentile(delay[inside], 95)) * 1000)
    figures = {
        "versions": float(len(counted)),
        "delivered_share": float(keep.sum()) / (len(counted) * subscribers),
        "spread_p50_ms": float(np.percentile(spread, 50)) * 1000,
    }
    if known:
        figures["publish_p50_ms"] = float(np.percentile(delay, 50)) * 1000
    return publish_p95, spread_p95, figures
