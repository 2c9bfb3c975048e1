"""benchmarks/results.py: the script that produces README's Results table (its pure parts; the
launches themselves are what it measures, minutes each)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "results.py"


def load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("results_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_variant_is_a_label_and_its_overrides() -> None:
    results = load_script()
    assert results.parse_variant("ratio8=learner.samples_per_insert=8,actor.max_steps_per_s=null") == (
        "ratio8",
        ("learner.samples_per_insert=8", "actor.max_steps_per_s=null"),
    )
    assert results.parse_variant("shipped=") == ("shipped", ())
    assert results.parse_variant("small=agent.hidden_sizes=[128,128],learner.torch_threads=2") == (
        "small",
        ("agent.hidden_sizes=[128,128]", "learner.torch_threads=2"),
    )
    with pytest.raises(SystemExit, match="LABEL=KEY=VALUE"):
        results.parse_variant("learner.samples_per_insert")


def test_the_summary_counts_runs_that_reached_and_ended_at_the_target() -> None:
    results = load_script()
    row = results.ROWS["cartpole"]
    runs = [
        {
            "ok": True,
            "time_to_target": 10.0,
            "final_eval": 500.0,
            "updates_per_s": 400.0,
            "wall_seconds": 30.0,
        },
        {
            "ok": True,
            "time_to_target": 14.0,
            "final_eval": 131.0,
            "updates_per_s": 420.0,
            "wall_seconds": 31.0,
        },
        {
            "ok": True,
            "time_to_target": None,
            "final_eval": 90.0,
            "updates_per_s": 410.0,
            "wall_seconds": 29.0,
        },
        {"ok": False, "error": "boom"},
    ]
    s = results.summarise(row, runs)
    assert (s["runs"], s["failed"], s["reached"], s["ended_at_target"]) == (4, 1, 2, 1)
    assert s["median_time_to_target"] == 12.0 and s["final_evals"] == [500.0, 131.0, 90.0]
    table = results.markdown({"cartpole": {"this checkout": s}}, [row])
    assert "| cartpole ≥ 475 | this checkout | 2/4 | 12.0 s (10.0–14.0) | 1/4 | 500, 131, 90 |" in table


def test_a_row_nobody_reached_reads_as_not_measured() -> None:
    results = load_script()
    s = results.summarise(results.ROWS["cartpole"], [{"ok": False, "error": "x"}])
    assert s["reached"] == 0 and math.isnan(s["median_time_to_target"])
