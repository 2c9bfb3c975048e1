"""Every tag a run writes is namespaced and in the metric catalog (zmqrl/metrics/catalog.py), with
meaning, unit, x-axis; docs/metrics.md's tables are the catalog's, regenerated.

Real runs write the tags (serial DQN with learner evaluation, serial SAC, and one `zmqrl launch` with
prioritized replay, the evaluator and the supervisor); the tags are read back from metrics.jsonl and
from the TensorBoard event files, so neither sink can carry a tag the other lacks or the catalog omits.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import zmqrl
from tests.conftest import REPO, launch_to_the_end, processes_mentioning, tiny_config, tiny_overrides
from tests.scripts import load_script
from zmqrl.metrics import METRICS_FILE, NAMESPACES, namespaced, read_metrics
from zmqrl.metrics.catalog import ENV_STEPS, TAGS, UPDATES, Tag, tag_table

docgen = load_script("docgen")

DOCS = REPO / "docs" / "metrics.md"
AXES = {ENV_STEPS, UPDATES}
# Returns are indexed by env steps; everything else by learner updates.
ENV_STEP_TAGS = re.compile(r"^(charts/.*|actor/recent_return)$")


def tag_problems(written: set[str], documented: dict[str, Tag]) -> list[str]:
    """What is wrong with the tags a run wrote: not namespaced, or not in the catalog."""
    problems = [
        f"{t}: not under one of {', '.join(NAMESPACES)}" for t in sorted(written) if not namespaced(t)
    ]
    problems += [
        f"{t}: written but not in zmqrl/metrics/catalog.py" for t in sorted(written - documented.keys())
    ]
    return problems


def jsonl_tags(run_dir: Path) -> dict[str, set[str]]:
    """source -> tags in the run's metrics.jsonl."""
    found: dict[str, set[str]] = {}
    for row in read_metrics(run_dir / METRICS_FILE):
        found.setdefault(row["source"], set()).add(row["tag"])
    return found


def event_file_tags(run_dir: Path) -> set[str]:
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    tags = set()
    for path in (run_dir / "tb").rglob("events.out.tfevents.*"):
        for event in EventFileLoader(str(path)).Load():
            tags.update(v.tag for v in event.summary.value)
    return tags


def assert_documented(run_dir: Path) -> set[str]:
    written = set().union(*jsonl_tags(run_dir).values())
    assert written, f"{run_dir} wrote no metrics"
    assert event_file_tags(run_dir) == written, "TensorBoard and metrics.jsonl hold different tags"
    assert tag_problems(written, tag_table()) == []
    return written


def test_the_catalog_gives_every_tag_a_namespace_meaning_unit_and_its_x_axis() -> None:
    table = tag_table()
    assert len(table) == len(TAGS) > 30, "a tag is listed twice"
    for tag, row in table.items():
        assert namespaced(tag), tag
        assert row.meaning and row.unit, f"{tag}: a meaning and a unit"
        assert "|" not in row.meaning + row.unit, f"{tag}: a | would split the docs' table cell"
        assert row.axis in AXES, f"{tag}: x-axis {row.axis!r} is not one of {AXES}"
        expected = ENV_STEPS if ENV_STEP_TAGS.match(tag) else UPDATES
        assert row.axis == expected, f"{tag}: returns go against env steps, all else against updates"
    assert {t.split("/")[0] for t in table} == set(NAMESPACES)


def test_the_check_fails_for_a_tag_the_catalog_does_not_list_or_outside_the_namespaces() -> None:
    table = tag_table()
    assert tag_problems({"charts/episodic_return", "losses/loss"}, table) == []
    assert tag_problems({"charts/episodic_return", "charts/made_up_return"}, table) == [
        "charts/made_up_return: written but not in zmqrl/metrics/catalog.py"
    ]
    problems = tag_problems({"evaluator/weights_version"}, table)  # the old, unnamespaced name
    assert len(problems) == 2 and problems[0].startswith("evaluator/weights_version: not under")


def test_docs_metrics_md_holds_the_catalogs_tables_as_generated() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert docgen.regenerate_metrics(text) == text, (
        "docs/metrics.md is stale: run `python benchmarks/docgen.py`"
    )
    for row in TAGS:
        assert f"| `{row.tag}` | {row.meaning} | {row.unit} | {row.axis} |" in text


def test_docgen_check_finds_a_stale_tag_table_and_rewrites_it(tmp_path: Path) -> None:
    text = DOCS.read_text(encoding="utf-8")
    copy = tmp_path / "metrics.md"
    copy.write_text(text.replace(f"| `{TAGS[0].tag}` |", "| `charts/renamed_return` |"), encoding="utf-8")
    assert docgen._update(copy, docgen.regenerate_metrics, check=True) == docgen.STALE
    assert docgen._update(copy, docgen.regenerate_metrics, check=False) == 0
    assert copy.read_text(encoding="utf-8") == text
    assert docgen._update(copy, docgen.regenerate_metrics, check=True) == 0
    with pytest.raises(ValueError, match="no generated region"):
        docgen.regenerate_metrics(text.replace(docgen.TAGS_END, ""))


@pytest.mark.parametrize(
    ("extra", "loss_tag"),
    [
        ({"learner__eval_interval": 100, "learner__log_interval": 50}, "losses/q_mean"),
        (
            {
                "agent__kind": "sac",
                "env__id": "Pendulum-v1",
                "learner__max_updates": 200,
                "learner__eval_interval": 100,
                "learner__log_interval": 50,
            },
            "losses/q_mean",
        ),
        (
            {
                "agent__kind": "appo",
                "learner__max_updates": 40,
                "learner__eval_interval": 20,
                "learner__log_interval": 10,
                "learner__sync_interval": 1,
            },
            "losses/policy_loss",
        ),
    ],
    ids=["dqn-with-learner-eval", "sac", "appo"],
)
def test_serial_runs_write_only_documented_tags(
    tmp_path: Path, extra: dict[str, object], loss_tag: str
) -> None:
    cfg = tiny_config(tmp_path / "runs", **extra)
    zmqrl.train(cfg, mode="serial")
    written = assert_documented(cfg.run_dir)
    assert {"charts/episodic_return", "charts/eval_return", loss_tag, "perf/updates_per_s"} <= written
    assert set(jsonl_tags(cfg.run_dir)) == {"learner"}


@pytest.mark.slow
@pytest.mark.heavy  # a real launch: kept out of the ~10-minute default suite
def test_a_launched_run_with_every_role_writes_only_documented_tags(run_root: Path) -> None:
    overrides = tiny_overrides(
        run_root,
        learner__max_updates=600,
        learner__log_interval=50,
        replay__prioritized="true",
        evaluator__enabled="true",
        evaluator__episodes=2,
        evaluator__interval_seconds=0.5,
    )
    result = launch_to_the_end(REPO / "configs" / "cartpole_dqn.yaml", overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = run_root / "t"
    written = assert_documented(run_dir)
    by_source = jsonl_tags(run_dir)
    assert {"learner", "evaluator", "supervisor"} <= by_source.keys(), by_source.keys()
    assert {"replay/per_beta", "replay/clipped_priorities"} <= by_source["learner"]
    assert {"charts/eval_return", "charts/eval_weights_version"} <= by_source["evaluator"]
    assert {"actor/alive", "supervisor/restarts"} <= by_source["supervisor"]
    assert {"charts/eval_return"} <= written
    assert processes_mentioning(str(run_root)) == []
