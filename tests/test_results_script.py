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


def stats_of(source: str, history: list[dict[str, float]], launched: float = 100.0) -> dict[str, object]:
    learner = {"updates": 900, "samples": 7000, "updates_per_s": 300.0}
    if source == "learner":
        return {"launched": launched, "learner": {**learner, "eval_history": history}}
    return {"launched": launched, "learner": learner, "evaluator": {"eval_history": history}}


def test_a_runs_figures_come_from_the_evaluator_when_it_ran_and_count_from_the_launch() -> None:
    results = load_script()
    learner_history = [
        {"time": 110.0, "mean": 300.0, "samples": 4000},
        {"time": 112.5, "mean": 480.0, "samples": 6000},
        {"time": 115.0, "mean": 470.0, "samples": 7000},
    ]
    got = results.figures(stats_of("learner", learner_history), 475.0, started=99.0)
    assert (got["time_to_target"], got["steps_at_target"]) == (12.5, 6000)
    assert (got["final_eval"], got["best_eval"], got["evaluations"]) == (470.0, 480.0, 3)
    evaluator_history = [{"time": 130.0, "mean": -150.0, "env_steps": 8000}]
    got = results.figures(stats_of("evaluator", evaluator_history), -200.0, started=99.0)
    assert (got["time_to_target"], got["steps_at_target"], got["updates"]) == (30.0, 8000, 900)
    untargeted = results.figures(stats_of("learner", learner_history), None, started=99.0)
    assert untargeted["time_to_target"] is None and untargeted["final_eval"] == 470.0


def run(seed: int, time_to_target: float | None, final: float) -> dict[str, object]:
    return {
        "seed": seed,
        "ok": True,
        "time_to_target": time_to_target,
        "steps_at_target": 40_000 if time_to_target else None,
        "final_eval": final,
        "best_eval": 500.0,
        "updates_per_s": 300.0,
        "wall_seconds": 45.0,
    }


def test_a_seed_measured_again_replaces_its_stored_entry_and_the_table_shows_every_seed(
    tmp_path: Path,
) -> None:
    results = load_script()
    row = results.ROWS["cartpole"]
    results.store(row, [run(0, 20.0, 500.0), run(1, 30.0, 131.0)], tmp_path)
    results.store(row, [run(1, 25.0, 500.0), run(2, None, 90.0)], tmp_path)
    stored = results.load_stored(tmp_path)
    assert [r["seed"] for r in stored["cartpole"]["runs"]] == [0, 1, 2]
    assert stored["cartpole"]["runs"][1]["time_to_target"] == 25.0
    assert stored["cartpole"]["command"] == "zmqrl launch configs/cartpole_dqn.yaml --set run.seed=S"
    table = results.readme_table(stored)
    line = next(line for line in table.splitlines() if "cartpole_dqn.yaml" in line)
    assert "| 0–2 | ≥ 475 on **2/3** | 22.5 s (20.0–25.0) | 40.0k |" in line
    assert "| 500.0 (90.0 to 500.0); ≥ 475 at the end on **2/3** |" in line


def test_readme_is_rewritten_between_its_markers_only() -> None:
    results = load_script()
    text = f"intro\n{results.BEGIN}\nold table\n{results.END}\nafter\n"
    assert (
        results.rewrite_readme(text, "| new |") == f"intro\n{results.BEGIN}\n| new |\n{results.END}\nafter\n"
    )
    with pytest.raises(SystemExit, match="markers"):
        results.rewrite_readme("no markers here", "| new |")


def test_readmes_results_table_is_what_the_stored_results_render() -> None:
    """Nobody edits the numbers by hand: README holds exactly the table docs/results/ renders."""
    results = load_script()
    readme = results.README.read_text()
    assert results.rewrite_readme(readme, results.readme_table(results.load_stored())) == readme


def test_spreads_use_true_minus_signs_and_seed_runs_read_as_ranges() -> None:
    results = load_script()
    assert results._spread([-144.2, -154.6, -135.4]) == "−144.2 (−154.6 to −135.4)"
    assert results._spread([7.0]) == "7.0" and results._spread([]) == "—"
    assert results._seeds([0, 1, 2, 3]) == "0–3" and results._seeds([0, 2]) == "0, 2"


def write_episodes(path: Path, episodes: list[tuple[int, float]]) -> None:
    """A metrics.jsonl with training episodes (step, return) among other tags, as the learner
    writes it."""
    import json

    rows = []
    for step, value in episodes:
        rows.append({"source": "learner", "tag": "losses/loss", "step": 1, "value": 0.5, "time": 1.0})
        rows.append({"source": "learner", "tag": "charts/episodic_return", "step": step, "value": value})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"cut short\n')


def test_training_return_is_the_mean_of_the_last_episodes_at_each_mark(tmp_path: Path) -> None:
    from zmqrl_bench.runs import training_returns

    metrics = tmp_path / "metrics.jsonl"
    # 300 episodes with return 1 up to step 500, then 150 with return 3 from step 501 to 948.
    write_episodes(
        metrics, [(i * 5 // 3, 1.0) for i in range(300)] + [(501 + i * 3, 3.0) for i in range(150)]
    )
    got = training_returns(metrics, (500, 700, 2000), window=100)
    assert got["500"] == 1.0  # the last 100 at or before 500: all from the first part
    # At 700: episodes up to step 700 of the second part (67 of them) and 33 of the first.
    assert got["700"] == pytest.approx((67 * 3.0 + 33 * 1.0) / 100)
    assert got["2000"] is None  # never passed: no figure it did not reach
    assert training_returns(tmp_path / "missing.jsonl", (1,)) == {"1": None}


def test_kept_runs_training_returns_are_stored_in_their_own_seeds_entry_only(tmp_path: Path) -> None:
    import json

    results = load_script()
    row = results.ROWS["minatar-seaquest"]
    store_dir = tmp_path / "store"
    results.store(
        row, [{**run(2, None, 3.0), "samples": 2_100_000}, {**run(1, None, 2.0), "samples": 7}], store_dir
    )
    for seed, samples in ((2, 2_100_000), (1, 999)):  # seed 1 was measured again since: not this run
        run_dir = tmp_path / "keep" / f"0-{seed}" / f"minatar-seaquest-s{seed}"
        run_dir.mkdir(parents=True)
        (run_dir / "stats.json").write_text(json.dumps({"learner": {"samples": samples}}))
        write_episodes(run_dir / "metrics.jsonl", [(s, 2.0) for s in range(0, 2_100_000, 10_000)])
    lines = results.backfill_training_returns(tmp_path / "keep", store_dir)
    runs = {r["seed"]: r for r in results.load_stored(store_dir)["minatar-seaquest"]["runs"]}
    assert runs[2]["train_return"] == {"500000": 2.0, "1000000": 2.0, "2000000": 2.0}
    assert "train_return" not in runs[1]
    assert any("skipped" in line for line in lines)


def test_docs_minatar_table_is_what_the_stored_results_render() -> None:
    results = load_script()
    doc = results.RESULTS_DOC.read_text()
    table = results.minatar_table(results.load_stored())
    assert results.rewrite_readme(doc, table, results.MINATAR_BEGIN, results.MINATAR_END) == doc


def test_the_minatar_table_averages_stored_training_returns_per_mark() -> None:
    results = load_script()
    runs = [
        {**run(0, None, 2.0), "samples": 2_180_000},  # measured before training returns were stored
        {
            **run(1, None, 3.0),
            "samples": 2_050_000,
            "train_return": {"500000": 1.0, "1000000": 2.0, "2000000": 3.0},
        },
        {
            **run(2, None, 1.5),
            "samples": 1_930_000,
            "train_return": {"500000": 2.0, "1000000": 3.0, "2000000": None},
        },
    ]
    table = results.minatar_table({"minatar-seaquest": {"runs": runs}})
    line = next(line for line in table.splitlines() if line.startswith("| Seaquest"))
    assert line == (
        "| Seaquest | 0–2 | 1.93M–2.18M | 1.5 / 2.5 / 3.0 (1 seed); seeds 1, 2 | 2.0, 3.0, 1.5 | "
        f"{results.MINATAR_PAPER['Seaquest']} |"
    )
