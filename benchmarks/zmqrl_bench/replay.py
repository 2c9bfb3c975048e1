"""`zmqrl bench` replay group: a prioritized training step's replay work against a uniform one.

What a learner step asks of replay: uniform replay samples a batch; prioritized replay samples a
batch by priority (with importance weights) and then writes the batch's new priorities back
(``update_priorities``). Both buffers hold the same CartPole-shaped rows, in the same process,
and are timed in alternating chunks of calls within each repeat, so load from other processes
falls on both sides alike and the ratio means something on a shared machine. The target (PER at
most 3x uniform) is what the compiled sum tree (zmqrl/replay/_sumtree.c) is for; with the numpy
reference (``ZMQRL_SUMTREE=numpy``) it is ~10x.

benchmarks/replay_bench.py prints the same measurements, plus adds, as a table of its own.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from zmqrl.replay import PrioritizedReplay, UniformReplay
from zmqrl.replay import sumtree as sumtree_module
from zmqrl.types import TransitionBatch
from zmqrl_bench.report import BenchSettings, Comparison, Stat

SECONDS = (15, 5)  # about how long run() takes: full, quick (`zmqrl bench` prints it first)
GROUP = "replay"
TARGET = 3.0  # PER sample + priority write-back at most this many times uniform sample
DEFAULT_CAPACITY = 100_000
OBS_SHAPE = (4,)  # CartPole
SAMPLE_BATCHES = (256, 64)
ADD_ROWS = 64  # rows per add: a typical actor send batch
FILL_CHUNK = 10_000  # rows per add while filling the buffers before timing
BETA = 0.4
SEED = 0
CHUNK_CALLS = 20  # calls per timed chunk; the sides alternate chunk by chunk
# One repeat lasts settings.seconds / this: 4 comparisons x 5 repeats x 0.67 s take ~14 s
# (full), 4 x 3 x 0.33 s ~4 s (quick).
SECONDS_DIVISOR = 3.0


def make_rows(n: int, rng: np.random.Generator) -> TransitionBatch:
    """``n`` random CartPole-shaped transitions (obs float32 (4,), discrete action)."""
    obs = rng.standard_normal((n, *OBS_SHAPE)).astype(np.float32)
    return TransitionBatch(
        obs=obs,
        action=rng.integers(0, 2, size=n),
        reward=np.ones(n, dtype=np.float32),
        next_obs=obs + np.float32(0.01),
        discount=np.full(n, 0.99, dtype=np.float32),
    )


def filled_buffers(capacity: int, rng: np.random.Generator) -> tuple[UniformReplay, PrioritizedReplay]:
    """A uniform and a prioritized buffer holding the same ``capacity`` rows (PER with random
    actor priorities, so the tree is not flat)."""
    uni = UniformReplay(capacity, OBS_SHAPE, np.float32, (), np.int64, seed=SEED)
    per = PrioritizedReplay(capacity, OBS_SHAPE, np.float32, (), np.int64, seed=SEED)
    for start in range(0, capacity, FILL_CHUNK):
        chunk = make_rows(min(FILL_CHUNK, capacity - start), rng)
        uni.add(chunk)
        per.add(chunk, rng.exponential(1.0, size=chunk.size))
    return uni, per


@dataclass(frozen=True)
class Case:
    """One operation timed on both buffers: ``per`` against ``uniform``."""

    name: str
    uniform: Callable[[], object]
    per: Callable[[], object]
    target: float | None


def cases(uni: UniformReplay, per: PrioritizedReplay, rng: np.random.Generator) -> list[Case]:
    """Sample steps (the targets) and, for information, adds of one actor batch (with its
    priorities, and without: at the maximum priority)."""
    out = []
    for b in SAMPLE_BATCHES:
        td = rng.exponential(1.0, size=b)  # stands in for the step's |TD errors|

        def uni_step(b: int = b) -> None:
            uni.sample(b)

        def per_step(b: int = b, td: np.ndarray = td) -> None:
            _, ids, _ = per.sample_prioritized(b, BETA)
            per.update_priorities(ids, td)

        out.append(Case(f"sample({b}) + update_priorities vs sample({b})", uni_step, per_step, TARGET))
    rows = make_rows(ADD_ROWS, rng)
    priorities = rng.exponential(1.0, size=ADD_ROWS)
    out.append(
        Case(
            f"add({ADD_ROWS}) with priorities vs add({ADD_ROWS})",
            lambda: uni.add(rows),
            lambda: per.add(rows, priorities),
            None,
        )
    )
    out.append(
        Case(
            f"add({ADD_ROWS}) at max priority vs add({ADD_ROWS})",
            lambda: uni.add(rows),
            lambda: per.add(rows),
            None,
        )
    )
    return out


def measure(case: Case, repeats: int, seconds: float) -> tuple[list[float], list[float]]:
    """µs per call of each side, one value per repeat: the median over that repeat's chunks,
    the sides alternating chunk by chunk (which side goes first alternates too)."""
    case.uniform()  # warm up: first-touch page faults, lazy imports
    case.per()
    fns = (case.uniform, case.per)
    uni_us: list[float] = []
    per_us: list[float] = []
    for repeat in range(repeats):
        chunks: tuple[list[float], list[float]] = ([], [])
        order = (0, 1) if repeat % 2 == 0 else (1, 0)
        deadline = time.perf_counter() + seconds
        while True:
            for side in order:
                fn = fns[side]
                t0 = time.perf_counter()
                for _ in range(CHUNK_CALLS):
                    fn()
                chunks[side].append((time.perf_counter() - t0) / CHUNK_CALLS * 1e6)
            if time.perf_counter() >= deadline:
                break
        uni_us.append(float(np.median(chunks[0])))
        per_us.append(float(np.median(chunks[1])))
    return uni_us, per_us


def run(settings: BenchSettings, capacity: int = DEFAULT_CAPACITY) -> list[Comparison]:
    """PER against uniform replay, one Comparison per operation (ours: PER µs per call)."""
    rng = np.random.default_rng(SEED)
    uni, per = filled_buffers(capacity, rng)
    seconds = settings.seconds / SECONDS_DIVISOR
    comparisons = []
    for case in cases(uni, per, rng):
        uni_us, per_us = measure(case, settings.repeats, seconds)
        comparisons.append(
            Comparison(
                group=GROUP,
                name=f"{case.name}, {capacity:,} rows",
                unit="µs",
                ours=Stat.of(per_us),
                reference=Stat.of(uni_us),
                target=case.target,
                higher_is_better=False,
                notes=f"sum tree: {sumtree_module.IMPLEMENTATION}",
            )
        )
    return comparisons
