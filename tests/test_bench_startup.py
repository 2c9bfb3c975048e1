"""`zmqrl bench`'s start-up part, run once: the shape of what it reports (never its timing)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from zmqrl_bench import startup
from zmqrl_bench.cli import PARTS, load_part
from zmqrl_bench.report import BenchSettings


@pytest.mark.heavy  # real launches of each role kind: about 30 s on 2 cores
def test_startup_part_reports_launch_phases_roles_and_imports(run_root: Path) -> None:
    assert "startup" in PARTS and load_part("startup") is startup
    rows = startup.run(BenchSettings(quick=True, repeats=1), root=run_root)
    assert all(row.group == "startup" and row.unit == "s" for row in rows)
    first, with_eval, *rest = rows

    # launch -> first update, against the 2 s target: the learner's marks come in order
    assert first.reference is not None and first.reference.values == (startup.TARGET_SECONDS,)
    assert first.target == 1.0 and first.higher_is_better is False and first.passed is not None
    marks = [first.extra[f"learner_{mark}_s"] for mark in startup.MARKS]
    assert marks == sorted(marks) and 0 < marks[-1] == first.ours.median
    assert first.extra["warmup_s"] >= 0
    # the same with the evaluator, side by side with the runs without it
    assert with_eval.reference == first.ours and with_eval.ours.median > 0
    assert "learner_first_update_s" in with_eval.extra

    up = {row.name.split()[0]: row for row in rest if " up " in row.name}
    assert set(up) == {"learner-0", "actor-0", "actor-1", "evaluator-0"}
    for name in ("learner-0", "actor-0", "actor-1"):  # the evaluator may be stopped before it is up
        row = up[name]
        assert 0 < row.extra["process_started_s"] <= row.ours.median < first.ours.median + 60
        assert not math.isnan(row.ours.median)
    assert "runs" in up["evaluator-0"].notes

    imports = {row.name.split()[1]: row for row in rest if row.name.startswith("import ")}
    assert set(imports) == {*startup.ROLE_MODULES.values(), "torch._dynamo"}
    for row in imports.values():
        assert row.ours.median > 0 and row.reference is not None
    # roles that act with numpy, and the supervisor, never import torch
    for module in ("zmqrl.cli.app", "zmqrl.supervisor.launch", "zmqrl.actor.main"):
        assert imports[module].notes == "no torch"
    assert imports["zmqrl.learner.main"].notes == "imports torch"


def test_role_times_read_first_and_up_lines(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "learner-0.log").write_text(
        "2026-01-01 00:00:01.500 DEBUG learner-0 zmqrl: pid 1: zmqrl learner\n"
        "a traceback line without a time\n"
        "2026-01-01 00:00:02.250 INFO learner-0 zmqrl.learner: learner up: samples tcp://x\n"
    )
    (logs / "actor-1.log").write_text("2026-01-01 00:00:01.000 INFO actor-1 zmqrl: actor id 1\n")
    start = startup._log_time("2026-01-01 00:00:00.000 ")
    assert start is not None
    started, up = startup.role_times(logs, start)
    assert started == {"actor-1": 1.0, "learner-0": 1.5}
    assert up == {"learner-0": 2.25}
