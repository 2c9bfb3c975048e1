"""The captured-vs-eager learner bench (zmqrl_bench.captured): one run times both sides of each
config on the device given, and the CPU run leaves the pixel configs out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zmqrl_bench import captured
from zmqrl_bench.report import CPU_PER_UPDATES, BenchSettings


def test_the_cpu_rows_time_captured_against_eager_for_each_small_config() -> None:
    rows = captured.run(BenchSettings(quick=True, repeats=2, seconds=0.02, device="cpu"))
    names = [name for name, on_cpu in captured.CONFIGS if on_cpu]
    assert [r.name.split(" ")[0] for r in rows] == [name for name in names for _ in range(2)]
    for speed, cost in zip(rows[::2], rows[1::2], strict=True):
        assert speed.group == cost.group == "capture"
        assert speed.unit == "updates/s" and cost.unit == CPU_PER_UPDATES and not cost.higher_is_better
        assert "cpu)" in speed.name and "captured vs eager" in speed.name
        assert speed.reference is not None and len(speed.ours.values) == len(speed.reference.values) == 2
        assert speed.ours.median > 0 and speed.reference.median > 0 and speed.ratio is not None


def test_main_prints_the_table_and_writes_the_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "capture.json"
    args = ["--device", "cpu", "--seconds", "0.02", "--repeats", "1", "--config", "cartpole_dqn"]
    captured.main([*args, "--json", str(out)])
    payload = json.loads(out.read_text())
    assert payload["meta"] == {"part": "capture", "device": "cpu"}
    assert [r["unit"] for r in payload["results"]] == ["updates/s", CPU_PER_UPDATES]
    assert payload["results"][0]["ratio"] > 0
    assert "cartpole_dqn (DQN, cpu): captured vs eager updates" in capsys.readouterr().out
