"""`zmqrl bench`: each part measures both sides and returns well-formed rows, leaving no process
behind; the command validates --only, writes JSON and exits by what crashed, not by what missed.

Speed ratios are never asserted here (the benchmark prints them): only behaviour.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from tests.conftest import processes_mentioning
from zmqrl_bench import actor, cli, ingest, scaling, weights
from zmqrl_bench.report import CPU_PER_STEPS, CPU_PER_UPDATES, BenchSettings, Comparison, Stat

TINY = BenchSettings(quick=True, repeats=1, seconds=0.3)


def children() -> list[str]:
    """Live child processes of this test process, but multiprocessing's resource tracker (it
    serves every later spawn and leaves with this process)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and fields[0] != "Z" and "resource_tracker" not in cmdline:
            found.append(cmdline)
    return found


def assert_measured(c: Comparison, group: str, compared: bool = True) -> None:
    assert c.group == group and c.name and c.unit
    # A plain measurement may be 0 (a learner that never got to train on a crowded machine).
    assert all(math.isfinite(v) and (v > 0 or not compared) and v >= 0 for v in c.ours.values)
    if compared:
        assert c.reference is not None and all(v > 0 for v in c.reference.values)
        assert c.ratio is not None and c.ratio > 0
    else:
        assert c.reference is None and c.ratio is None and c.passed is None
    json.dumps(c.to_json())  # the JSON the command writes


def test_actor_part_compares_the_real_actor_and_its_sampling_code_with_the_bare_loop() -> None:
    row, alone, unprioritized = actor.run(TINY)
    assert_measured(row, "actor")
    assert row.unit == "transitions/s" and row.target == actor.TARGET and row.higher_is_better
    assert row.extra["bytes_per_s"] > 0, "the actor's batches reached the PULL socket"
    assert row.extra["cpu_s_per_1k_steps"] > 0, "the actor's CPU time over its window, from /proc"
    assert_measured(alone, "actor")  # the sampling code alone: a diagnosis, without a target
    assert "alone" in alone.name and alone.target is None and alone.passed is None
    assert_measured(unprioritized, "actor")
    assert "without PER" in unprioritized.name and unprioritized.target is None
    assert children() == []


def test_ingest_part_measures_cartpole_and_atari_sized_batches() -> None:
    rows = ingest.run(TINY)
    assert [r.name.split(" ")[0] for r in rows] == ["CartPole-sized", "Atari-sized"]
    for row in rows:
        assert_measured(row, "ingest")
        assert row.target == ingest.INGEST_TARGET
    assert children() == [], "the synthetic senders are gone"


def test_weights_part_reports_p50_and_p95_latencies_across_processes() -> None:
    rows = weights.run(TINY)
    assert len(rows) == 4
    for row in rows:
        assert_measured(row, "weights")
        assert row.unit == "ms" and not row.higher_is_better
    assert [r.target for r in rows] == [None, 2.0, None, 2.0], "the target bounds p95"
    assert rows[2].extra["message_bytes"] > 50 * rows[0].extra["message_bytes"], "the CNN is the big one"
    assert children() == [], "the subscriber process is gone"


def test_steady_state_starts_after_every_actor_is_up_and_training() -> None:
    P = scaling.Point
    points = [
        P(10.0, 0, 900, 1),  # filling replay, one actor of two up
        P(10.5, 5, 1000, 2),  # all up, training: steady state from 0.5 s later
        P(11.0, 50, 2000, 2),
        P(11.5, 100, 3000, 2),
        P(11.5, 100, 3000, 2),  # the same heartbeat asked about twice
        P(12.5, 300, 5000, 2),
    ]
    rates = scaling.steady_rates(points, actors=2, warmup=0.5)
    assert rates == {"updates": [100.0, 200.0], "samples": [2000.0, 2000.0]}
    assert scaling.steady_rates(points[:1], actors=2) == {"updates": [], "samples": []}


@pytest.mark.heavy  # a real launch: about 10-15 s, in the heavy run with the other long launches
def test_scaling_part_runs_real_launches_and_synthetic_senders(run_root: Path) -> None:
    rows = scaling.run(TINY, actor_counts=(1,), senders=2, run_root=run_root, learners=False)
    units = [r.unit for r in rows]  # the CPU costs where the processes' counters could be read
    assert units[:2] == ["transitions/s", "updates/s"] and units[-1] == "transitions/s"
    assert set(units[2:-1]) <= {CPU_PER_STEPS, CPU_PER_UPDATES}
    for row in rows:
        assert_measured(row, "scaling", compared=False)
    assert "2 synthetic senders" in rows[-1].name
    assert processes_mentioning(str(run_root)) == [] and children() == []


def test_only_names_the_valid_parts_on_a_typo(tmp_path: Path) -> None:
    out = tmp_path / "b.json"
    result = CliRunner().invoke(cli.app, ["--only", "actor,actr", "--json", str(out)])
    assert result.exit_code == 2
    assert "'actr'" in result.output and ", ".join(cli.PARTS) in result.output
    assert not out.exists(), "nothing ran"


def test_bench_runs_one_part_and_writes_json_and_markdown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli.BenchSettings, "make", classmethod(lambda cls, quick: TINY))
    out, md = tmp_path / "bench" / "b.json", tmp_path / "b.md"
    result = CliRunner().invoke(
        cli.app, ["--quick", "--only", "actor", "--json", str(out), "--markdown", str(md)]
    )
    assert result.exit_code == 0, result.output
    assert "actor: measuring (about" in result.output and "transitions/s" in result.output
    data = json.loads(out.read_text())
    assert {r["group"] for r in data["results"]} == {"actor"} and len(data["results"]) == 3  # quick: 1 env
    meta = data["meta"]
    assert (
        meta["quick"] is True
        and meta["ran"] == ["actor"]
        and meta["command"] == "zmqrl bench --quick --only actor"
    )
    assert {"date", "hostname", "cpu", "cores", "python", "torch", "numpy"} <= set(meta)
    assert md.read_text().startswith("| group |")
    assert children() == []


def fake_part(rows: list[Comparison] | None) -> SimpleNamespace:
    def run(settings: BenchSettings) -> list[Comparison]:
        if rows is None:
            raise RuntimeError("this part crashed")
        return rows

    return SimpleNamespace(run=run, SECONDS=(1, 1))


def test_missed_targets_exit_0_and_crashes_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missed = Comparison("actor", "slow", "transitions/s", Stat.of([1.0]), Stat.of([2.0]), target=0.9)
    parts = {"actor": fake_part([missed]), "ingest": fake_part(None), "weights": None}
    monkeypatch.setattr(cli, "load_part", parts.get)
    out = tmp_path / "b.json"

    result = CliRunner().invoke(cli.app, ["--only", "actor,weights", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "MISSED: actor: slow: 0.50x, target at least 0.9x" in result.output
    assert "weights: skipped" in result.output

    result = CliRunner().invoke(cli.app, ["--only", "actor,ingest", "--json", str(out)])
    assert result.exit_code == 1
    assert "RuntimeError: this part crashed" in result.output and "ingest: FAILED" in result.output
    meta = json.loads(out.read_text())["meta"]
    assert meta["failed"] == ["ingest"] and meta["ran"] == ["actor"], "the other parts' results are kept"
