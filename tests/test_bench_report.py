"""`zmqrl bench`'s table never shows a missed target as if it were met."""

from __future__ import annotations

from zmqrl_bench.report import Comparison, Stat, table_rows


def row(ours: float, reference: float, target: float, higher_is_better: bool = True) -> list[str]:
    c = Comparison(
        "learner", "x", "updates/s", Stat.of([ours]), Stat.of([reference]), target, higher_is_better
    )
    (cells,) = table_rows([c])
    return cells


def test_a_miss_that_rounds_onto_its_target_shows_a_third_decimal() -> None:
    assert row(687, 767, 0.9)[5:] == ["0.896x", "≥ 0.9x", "MISSED"]
    assert row(2.004, 1.0, 2.0, higher_is_better=False)[5:] == ["2.004x", "≤ 2x", "MISSED"]


def test_other_ratios_keep_two_decimals() -> None:
    assert row(700, 767, 0.9)[5:] == ["0.91x", "≥ 0.9x", "ok"]
    assert row(300, 767, 0.9)[5:] == ["0.39x", "≥ 0.9x", "MISSED"]
    assert row(900, 1000, 0.9)[5:] == ["0.90x", "≥ 0.9x", "ok"]
