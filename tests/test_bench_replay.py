"""`zmqrl bench`'s replay group returns well-formed comparisons (no speed is asserted: the ratio
is for the benchmark to print, not for a test on a shared machine to judge)."""

from __future__ import annotations

from zmqrl_bench import replay
from zmqrl_bench.report import BenchSettings, markdown_table


def test_replay_bench_compares_per_with_uniform_per_operation() -> None:
    settings = BenchSettings(quick=True, repeats=2, seconds=0.003)
    comparisons = replay.run(settings, capacity=500)
    assert [c.name.split(" vs ")[0] for c in comparisons] == [
        "sample(256) + update_priorities",
        "sample(64) + update_priorities",
        "add(64) with priorities",
        "add(64) at max priority",
    ]
    for c in comparisons:
        assert c.group == "replay" and c.unit == "µs" and not c.higher_is_better
        assert c.reference is not None and len(c.ours.values) == len(c.reference.values) == 2
        assert min(c.ours.values) > 0 and min(c.reference.values) > 0
        assert c.ratio is not None
    assert [c.target for c in comparisons] == [3.0, 3.0, None, None]
    assert comparisons[0].passed is not None
    assert "replay" in markdown_table(comparisons)
