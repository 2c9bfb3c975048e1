"""Side-by-side cost of uniform vs prioritized replay on CartPole-shaped rows.

Why: prioritized replay adds a sum-tree descent per sample and a sum-tree update per training step
(``update_priorities``) and per ``add``; this measures what that costs relative to the uniform ring
in the same process and the same run, so the ratio is meaningful on a noisy shared machine.

The measurements are `zmqrl bench`'s replay group (benchmarks/zmqrl_bench/replay.py): in each repeat the two
sides run in alternating chunks of calls for ``--seconds``, and each side's figure is the median
chunk; the table shows the median over ``--repeats`` with the min-max spread. The sum tree is the
compiled one where it was built; ``ZMQRL_SUMTREE=numpy`` measures the numpy reference instead.

    python benchmarks/replay_bench.py                     # capacity 100_000, ~15 s
    python benchmarks/replay_bench.py --capacity 1000000
    ZMQRL_SUMTREE=numpy python benchmarks/replay_bench.py
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from zmqrl.replay import sumtree
from zmqrl_bench.replay import DEFAULT_CAPACITY, SEED, cases, filled_buffers, measure

DEFAULT_REPEATS = 5
DEFAULT_SECONDS = 0.7  # per repeat and operation


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.1f} ({min(values):.1f}-{max(values):.1f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY, help="e.g. 1000000")
    parser.add_argument("--repeats", type=int, default=DEFAULT_REPEATS)
    parser.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="per repeat and operation")
    args = parser.parse_args()
    rng = np.random.default_rng(SEED)
    t0 = time.perf_counter()
    uni, per = filled_buffers(args.capacity, rng)
    print(
        f"capacity {args.capacity:,}: filled both buffers in {time.perf_counter() - t0:.2f} s; "
        f"sum tree: {sumtree.IMPLEMENTATION}"
    )
    rows = []
    for case in cases(uni, per, rng):
        uni_us, per_us = measure(case, args.repeats, args.seconds)
        ratio = statistics.median(per_us) / statistics.median(uni_us)
        target = "" if case.target is None else f"≤ {case.target:g}x"
        rows.append((case.name, spread(uni_us), spread(per_us), f"{ratio:.2f}", target))
    headers = ("operation (PER vs uniform)", "uniform µs", "PER µs", "PER/uniform", "target")
    widths = [max(len(row[i]) for row in (headers, *rows)) for i in range(len(headers))]
    for row in (headers, *rows):
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w)
                for i, (cell, w) in enumerate(zip(row, widths, strict=True))
            )
        )


if __name__ == "__main__":
    main()
