"""`zmqrl bench`'s scaling part made ready for a bigger machine: CPU cost per 1,000 env steps and
updates read off the processes' kernel counters, ``--actors`` and ``--device`` (an absent device
is one line and exit 2), the convolutional learners' rows, and benchmarks/device_check.sh's JSON.

Speed is never asserted: only what is measured, how it is computed and what shape it takes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from tests.conftest import processes_mentioning
from zmqrl.api import load_config
from zmqrl.errors import EnvError
from zmqrl_bench import cli, cnn_learner, cpu, scaling
from zmqrl_bench.report import CPU_PER_STEPS, CPU_PER_UPDATES, BenchSettings, Comparison

ROOT = Path(__file__).resolve().parents[1]
TINY = BenchSettings(quick=True, repeats=1, seconds=0.05)


# ---- CPU time of a process ----------------------------------------------------------------------


def test_a_process_cpu_seconds_are_its_kernel_counters_and_grow_with_its_work() -> None:
    before = cpu.process_cpu_seconds(os.getpid())
    assert before is not None and before >= 0
    start = time.process_time()
    while time.process_time() - start < 0.1:  # work, not a sleep: CPU time must be charged
        sum(range(1000))
    after = cpu.process_cpu_seconds(os.getpid())
    assert after is not None and after - before >= 0.05  # clock ticks: 10 ms resolution
    assert cpu.total_cpu_seconds([os.getpid(), os.getpid()]) == pytest.approx(2 * after, abs=0.1)


def test_a_gone_process_reads_as_none_and_nothing_counted_has_no_cost() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()  # reaped: its /proc entry is gone
    assert cpu.process_cpu_seconds(proc.pid) is None
    assert cpu.total_cpu_seconds([os.getpid(), proc.pid]) is None
    assert cpu.per_thousand(3.0, 0) is None and cpu.per_thousand(3.0, 1500) == 2.0


# ---- costs between heartbeats ---------------------------------------------------------------------


def point(
    t: float, updates: int, samples: int, learner: float, actors: float, pids=(10, 11)
) -> scaling.Point:
    # Read 0.1 s after each heartbeat: both clocks advance alike in steady state.
    return scaling.Point(t, updates, samples, 1, t + 0.1, learner, actors, pids)


def test_costs_are_cpu_rates_over_throughputs_of_the_same_processes_in_steady_state() -> None:
    points = [
        point(0.0, 0, 0, 0.0, 0.0),  # training not begun: before steady state
        point(1.0, 100, 10_000, 0.5, 0.4),
        point(2.0, 600, 50_000, 1.5, 1.2),  # 500 updates/s on 1 CPU-s/s: 2 CPU-s per 1,000
        point(2.5, 850, 70_000, 2.0, 1.6),  # 40k transitions/s on 0.8 CPU-s/s: 0.02 per 1,000
        point(3.0, 1100, 90_000, 2.5, 2.0, pids=(10, 12)),  # an actor restarted: not comparable
        point(3.5, 1350, 110_000, 3.0, None, pids=(10, 12)),  # its CPU could not be read
    ]
    costs = scaling.steady_costs(points, actors=1, warmup=0.0)
    assert costs["learner"] == pytest.approx([2.0, 2.0, 2.0])
    assert costs["actors"] == pytest.approx([0.02, 0.02])
    assert scaling.steady_rates(points, actors=1, warmup=0.0)["updates"] == pytest.approx([500.0] * 4)
    assert scaling.steady_costs(points[:1], actors=1) == {"learner": [], "actors": []}


def test_a_runs_rows_give_throughputs_then_their_cpu_costs_and_leave_out_what_was_not_read() -> None:
    measured = scaling.RunRates([500.0], [40_000.0], True, [2.0], [0.02])
    rows = scaling.run_rows(2, 7.0, measured)
    assert [r.unit for r in rows] == ["transitions/s", "updates/s", CPU_PER_STEPS, CPU_PER_UPDATES]
    assert [r.higher_is_better for r in rows] == [True, True, False, False]
    assert rows[2].name == "CartPole, 2 uncapped actors: actors' CPU per 1,000 env steps"
    assert all(r.group == "scaling" and r.reference is None and "steady state" in r.notes for r in rows)
    unread = scaling.run_rows(1, 6.5, scaling.RunRates([500.0], [40_000.0], False, [], []))
    assert [r.unit for r in unread] == ["transitions/s", "updates/s"] and "whole run" in unread[0].notes


# ---- --actors and --device ------------------------------------------------------------------------


def recording_part(seen: list[BenchSettings]) -> SimpleNamespace:
    def run(settings: BenchSettings) -> list[Comparison]:
        seen.append(settings)
        return []

    return SimpleNamespace(run=run, SECONDS=(1, 1))


def test_a_device_this_machine_lacks_is_one_line_and_exit_2_before_anything_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[BenchSettings] = []
    monkeypatch.setattr(cli, "load_part", lambda name: recording_part(seen))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "b.json"
    result = CliRunner().invoke(cli.app, ["--only", "scaling", "--device", "cuda", "--json", str(out)])
    assert result.exit_code == 2
    assert result.output.strip().count("\n") == 0, result.output
    assert result.output.startswith("error: --device cuda:") and "no CUDA device" in result.output
    for bad in (["--device", "tpu"], ["--actors", "1,0"], ["--actors", "two"]):
        result = CliRunner().invoke(cli.app, ["--only", "scaling", *bad, "--json", str(out)])
        assert result.exit_code == 2 and result.output.startswith(f"error: {bad[0]}:"), result.output
    assert seen == [] and not out.exists()


def test_actors_and_device_reach_the_parts_and_the_json(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[BenchSettings] = []
    monkeypatch.setattr(cli, "load_part", lambda name: recording_part(seen))
    out = tmp_path / "b.json"
    args = ["--quick", "--only", "scaling", "--actors", "1,2,16", "--device", "cpu", "--json", str(out)]
    result = CliRunner().invoke(cli.app, args)
    assert result.exit_code == 0, result.output
    assert [(s.actors, s.device, s.quick) for s in seen] == [((1, 2, 16), "cpu", True)]
    meta = json.loads(out.read_text())["meta"]
    assert meta["actors"] == [1, 2, 16] and meta["device"] == "cpu"
    assert meta["command"] == "zmqrl bench --quick --only scaling --actors 1,2,16 --device cpu"


# ---- the convolutional learners ----------------------------------------------------------------------


def test_cpu_rows_cut_an_appo_batch_to_whole_rollouts_and_a_gpu_keeps_the_configs() -> None:
    cfg = load_config(cnn_learner.CONFIG_DIR / "pong_appo.yaml", [])
    cut = cnn_learner.appo_overrides(cfg, "cpu", quick=True)
    assert cut == [
        "agent.device=cpu",
        "agent.batch_size=128",
        "agent.minibatches=2",
        "actor.envs_per_actor=2",
    ]
    assert load_config(cnn_learner.CONFIG_DIR / "pong_appo.yaml", cut).agent.batch_size == 128  # valid
    assert cnn_learner.appo_overrides(cfg, "cuda", quick=True) == ["agent.device=cuda"]


def test_without_the_env_package_the_games_known_spaces_stand_in(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(*args: object, **kwargs: object) -> None:
        raise EnvError("ale-py is not installed")

    monkeypatch.setattr(cnn_learner, "make_env", missing)
    for name, shape, actions in (("pong_dqn", (4, 84, 84), 6), ("minatar_breakout_appo", (4, 10, 10), 3)):
        spec, source = cnn_learner.spec_for(load_config(cnn_learner.CONFIG_DIR / f"{name}.yaml", []))
        assert (spec.obs_shape, spec.obs_dtype, spec.num_actions) == (shape, "uint8", actions)
        assert "known spaces" in source
        batch = cnn_learner.transition_batch(spec, 8, np.random.default_rng(0))
        assert batch.obs.shape == (8, *shape) and batch.obs.dtype == np.uint8
        assert batch.obs.max() <= spec.obs_high and (batch.action < actions).all()


def test_the_cnn_learner_rows_time_each_config_on_the_device_with_its_cpu_cost() -> None:
    rows = cnn_learner.run(BenchSettings(quick=True, repeats=1, seconds=0.05, device="cpu"))
    names = {r.name.split(" ")[0] for r in rows}
    assert names == set(cnn_learner.CONFIGS)
    assert all(r.group == "scaling" and r.reference is None and r.ours.median > 0 for r in rows)
    dqn = [r for r in rows if r.name.startswith("pong_dqn")]
    assert [r.unit for r in dqn] == ["updates/s", CPU_PER_UPDATES] and "(DQN, cpu)" in dqn[0].name
    assert "batches of 512" in dqn[0].name and "synthetic" in dqn[0].notes
    appo = [r for r in rows if r.name.startswith("pong_appo")]
    assert [r.unit for r in appo] == ["updates/s", "env steps/s", CPU_PER_UPDATES]
    assert all("(CPU: batch 128 of the config's 4096)" in r.name for r in appo)


# ---- benchmarks/device_check.sh ---------------------------------------------------------------------


def device_check(tmp_path: Path, run_root: Path, timeout: float, **settings: str) -> tuple[int, str, Path]:
    """benchmarks/device_check.sh in quick mode with ``settings`` (ZMQRL_DEVICE_CHECK_<KEY>=value);
    its exit code, output and JSON path. Its runs go under ``run_root`` (TMPDIR): the fixture kills
    anything left there."""
    out = tmp_path / "device_check.json"
    run_root.mkdir(parents=True, exist_ok=True)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_DEVICE_CHECK_")},
        "ZMQRL_DEVICE_CHECK_QUICK": "1",
        "ZMQRL": f"{sys.executable} -m zmqrl",
        "PYTHON": sys.executable,
        "TMPDIR": str(run_root),
        **{f"ZMQRL_DEVICE_CHECK_{key.upper()}": value for key, value in settings.items()},
    }
    proc = subprocess.Popen(
        ["bash", str(ROOT / "benchmarks" / "device_check.sh"), str(out)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, output.decode(errors="replace"), out


@pytest.mark.heavy  # a real launch and the CNN rows: about 50 s on 2 cores, the default run's longest
def test_device_check_quick_mode_writes_one_json_of_the_scaling_set(tmp_path: Path, run_root: Path) -> None:
    code, output, out = device_check(tmp_path, run_root, 300, parts="scaling", appo_seconds="0")
    assert code == 0, output[-3000:]
    data = json.loads(out.read_text())
    meta = data["meta"]
    assert meta["ran"] == ["scaling"] and meta["failed"] == [] and meta["quick"] is True
    assert meta["actors"] == [1] and meta["device"] == "cpu"
    rows = data["results"]
    units = {(r["name"].split(":")[0], r["unit"]) for r in rows}
    assert {
        ("CartPole, 1 uncapped actor", u)
        for u in ("transitions/s", "updates/s", CPU_PER_STEPS, CPU_PER_UPDATES)
    } <= units
    assert any(r["name"].startswith("ingest from") for r in rows)
    for name in cnn_learner.CONFIGS:
        assert any(r["name"].startswith(name) and r["unit"] == "updates/s" for r in rows), name
    for r in rows:
        assert r["group"] == "scaling" and r["reference"] is None and r["ratio"] is None
        assert r["ours"]["values"] and all(v >= 0 for v in r["ours"]["values"])
    assert "APPO run skipped" in output and not (tmp_path / "device_check-appo").exists()
    assert processes_mentioning(str(run_root)) == []


@pytest.mark.slow  # the mlp part and a short MinAtar APPO launch: about 20 s on 2 cores
def test_device_check_quick_mode_keeps_the_appo_runs_curve_beside_the_json(
    tmp_path: Path, run_root: Path
) -> None:
    # 6 s of training rather than the quick mode's 3: on a loaded machine the learner's start-up
    # took all 3 once, and the run made no update to draw a curve from.
    code, output, out = device_check(tmp_path, run_root, 300, parts="mlp", appo_seconds="6")
    assert code == 0, output[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert {r["group"] for r in rows} == {"mlp"} and any(r["unit"] == "updates/s" for r in rows)
    appo = tmp_path / "device_check-appo"
    assert {"metrics.jsonl", "stats.json", "learner-stats.json", "summary.txt", "launch.log"} <= {
        p.name for p in appo.iterdir()
    }
    stats = json.loads((appo / "stats.json").read_text())
    assert stats["learner"]["updates"] >= 1 and len(stats["actors"]) == 1
    tags = {json.loads(line)["tag"] for line in (appo / "metrics.jsonl").read_text().splitlines()}
    assert "charts/eval_return" in tags  # the curve: `zmqrl plot` reads this file
    assert "minatar_breakout_appo with 1 actors, learner on cpu, 6 s of training" in output
    assert not list(run_root.glob("zmqrl-device-check-*")), "the APPO run's directory is removed"
    assert processes_mentioning(str(run_root)) == []


def test_device_check_installs_a_wheelhouse_and_gives_the_appo_run_only_what_the_budget_leaves(
    tmp_path: Path, run_root: Path
) -> None:
    """Offline, as on the GPU machine: every wheel in the directory goes into a site directory of the
    script's own; with 30 s of budget nothing is left for an APPO run after its margin."""
    import zipfile

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    info = "zmqrl_wheel_probe-1.0.dist-info"
    with zipfile.ZipFile(wheels / "zmqrl_wheel_probe-1.0-py3-none-any.whl", "w") as whl:
        whl.writestr("zmqrl_wheel_probe.py", "VALUE = 1\n")
        whl.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: zmqrl-wheel-probe\nVersion: 1.0\n")
        whl.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        whl.writestr(f"{info}/RECORD", "")
    full_mode = {"quick": "0", "parts": "none", "wheels": str(wheels), "seconds": "30"}
    code, output, _ = device_check(tmp_path, run_root, 120, **full_mode)
    assert code == 0, output
    assert (run_root / "zmqrl-device-check-site" / "zmqrl_wheel_probe.py").is_file()
    assert f"installing the wheels in {wheels}" in output
    assert "APPO run skipped" in output and "in the 30 s budget" in output


@pytest.mark.heavy  # every step of the quick mode: about 90 s on 2 cores
def test_device_check_quick_mode_runs_every_step(tmp_path: Path, run_root: Path) -> None:
    code, output, out = device_check(tmp_path, run_root, 600)
    assert code == 0, output[-3000:]
    data = json.loads(out.read_text())
    assert data["meta"]["ran"] == ["scaling", "fanin", "mlp"] and data["meta"]["failed"] == []
    groups = {r["group"] for r in data["results"]}
    assert groups == {"scaling", "fanin", "mlp"}
    fanin_rows = [r for r in data["results"] if r["group"] == "fanin"]
    assert any("8 simulated actors: learner updates/s" in r["name"] and r["ratio"] for r in fanin_rows)
    assert (tmp_path / "device_check-appo" / "metrics.jsonl").is_file()
    assert processes_mentioning(str(run_root)) == []
