"""Side-by-side cost of uniform vs prioritized replay on CartPole-shaped rows.

Why: prioritized replay adds a sum-tree descent per sample and a sum-tree update per training step
(``update_priorities``) and per ``add``; this measures what that costs relative to the uniform ring
in the same process and the same run, so the ratio is meaningful on a noisy shared machine.

Each figure is the best (minimum) over ``--repeats`` timing rounds of the mean over ``--calls``
calls: the minimum estimates the cost without interference from other processes.

    python benchmarks/replay_bench.py                     # capacity 100_000, < ~20 s
    python benchmarks/replay_bench.py --capacity 1000000
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from zmqrl.replay import DEFAULT_ALPHA, DEFAULT_PRIORITY_EPS, PrioritizedReplay, UniformReplay
from zmqrl.types import TransitionBatch

DEFAULT_CAPACITY = 100_000
OBS_SHAPE = (4,)  # CartPole
SAMPLE_BATCHES = (64, 256)
ADD_ROWS = 64  # rows per add: a typical actor send batch
FILL_CHUNK = 10_000  # rows per add while filling the buffers before timing
BETA = 0.4
DEFAULT_REPEATS = 9
DEFAULT_CALLS = 300
SEED = 0


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


def best_of(fn: Callable[[], object], repeats: int, calls: int) -> float:
    """Best-of-``repeats`` mean seconds per call of ``fn`` over ``calls`` calls."""
    fn()  # warm up (first-touch page faults, lazy imports)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY, help="e.g. 1000000")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--calls", type=int, default=DEFAULT_CALLS)
    args = parser.parse_args()
    cap = args.capacity
    rng = np.random.default_rng(SEED)

    uni = UniformReplay(cap, OBS_SHAPE, np.float32, (), np.int64, seed=SEED)
    per = PrioritizedReplay(
        cap,
        OBS_SHAPE,
        np.float32,
        (),
        np.int64,
        seed=SEED,
        alpha=DEFAULT_ALPHA,
        priority_eps=DEFAULT_PRIORITY_EPS,
    )
    t0 = time.perf_counter()
    for start in range(0, cap, FILL_CHUNK):
        chunk = make_rows(min(FILL_CHUNK, cap - start), rng)
        uni.add(chunk)
        per.add_with_priorities(chunk, rng.exponential(1.0, size=chunk.size))
    print(f"capacity {cap:,}: filled both buffers in {time.perf_counter() - t0:.2f} s")

    rows: list[tuple[str, float, float]] = []
    for b in SAMPLE_BATCHES:
        td = rng.exponential(1.0, size=b)

        def uni_step(b: int = b) -> None:
            uni.sample(b)

        def per_step(b: int = b, td: np.ndarray = td) -> None:
            _, ids, _ = per.sample_prioritized(b, BETA)
            per.update_priorities(ids, td)

        rows.append(
            (
                f"sample({b}) [+ update_priorities]",
                best_of(uni_step, args.repeats, args.calls),
                best_of(per_step, args.repeats, args.calls),
            )
        )
    add_batch = make_rows(ADD_ROWS, rng)
    add_pri = rng.exponential(1.0, size=ADD_ROWS)
    rows.append(
        (
            f"add({ADD_ROWS} rows) [with priorities]",
            best_of(lambda: uni.add(add_batch), args.repeats, args.calls),
            best_of(lambda: per.add_with_priorities(add_batch, add_pri), args.repeats, args.calls),
        )
    )
    rows.append(
        (
            f"add({ADD_ROWS} rows) [max priority]",
            best_of(lambda: uni.add(add_batch), args.repeats, args.calls),
            best_of(lambda: per.add(add_batch), args.repeats, args.calls),
        )
    )

    width = max(len(name) for name, _, _ in rows)
    print(f"{'operation':<{width}}  {'uniform µs':>11}  {'PER µs':>9}  {'PER/uniform':>11}")
    for name, u, p in rows:
        print(f"{name:<{width}}  {u * 1e6:>11.1f}  {p * 1e6:>9.1f}  {p / u:>11.2f}")


if __name__ == "__main__":
    main()
