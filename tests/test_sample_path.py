"""The sample path is measured, not listed by hand: benchmarks/sample_path.py counts the lines of
zmqrl a launched run executes per file, and how one message's decode moves between modules; the
list in docs/architecture.md is its output, kept equal to docs/results/sample-path.json here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import REPO

SCRIPT = REPO / "benchmarks" / "sample_path.py"
RESULTS = REPO / "docs" / "results" / "sample-path.json"


@pytest.fixture(scope="module")
def sample_path() -> ModuleType:
    spec = importlib.util.spec_from_file_location("sample_path_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_documented_path_is_the_measured_one(sample_path: ModuleType) -> None:
    data = json.loads(RESULTS.read_text())
    assert sample_path.documented() == sample_path.render_docs(data), (
        "docs/architecture.md's sample path differs from docs/results/sample-path.json (or a listed "
        "module's first docstring sentence changed): python benchmarks/sample_path.py "
        "--from-json docs/results/sample-path.json"
    )


def test_every_measured_file_exists_and_both_runs_are_recorded() -> None:
    data = json.loads(RESULTS.read_text())
    assert set(data["runs"]) == {"dqn", "appo"}
    for run in data["runs"].values():
        missing = [path for path in run["files"] if not (REPO / path).is_file()]
        assert not missing, f"measured files that no longer exist (measure again): {missing}"
        assert run["lines"] == sum(row["union"] for row in run["files"].values()) > 0


def test_the_housekeeping_split_names_files_that_exist_and_adds_up(sample_path: ModuleType) -> None:
    """The control plane and reporting shown apart from the samples' own path: a renamed module
    would silently move its lines into "samples"."""
    listed = [path for paths in sample_path.HOUSEKEEPING.values() for path in paths]
    assert all((REPO / path).is_file() for path in listed), listed
    for run in json.loads(RESULTS.read_text())["runs"].values():
        parts = sample_path.housekeeping(run["files"])
        assert sum(parts.values()) == run["lines"] and min(parts.values()) > 0, parts


def test_one_message_is_decoded_in_five_transport_modules_at_most(
    sample_path: ModuleType,
) -> None:
    """A real CartPole DQN message (with priorities) through the learner's receiver, traced:
    the decoder is one module the receiver enters twice (the message, then the group's rows)."""
    decode = sample_path.measure_decode()
    assert decode["transport_modules"] <= 5 and decode["transport_returns"] <= 2, decode
    recorded = json.loads(RESULTS.read_text())["decode"]
    assert decode == recorded, "the decode path changed: measure again (benchmarks/sample_path.py --json ...)"


@pytest.mark.heavy  # a traced launch of a few hundred updates
def test_the_script_measures_a_launched_run(tmp_path: Path, sample_path: ModuleType) -> None:
    out = tmp_path / "path.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--runs", "dqn", "--json", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = json.loads(out.read_text())["runs"]["dqn"]
    roles = {role for row in run["files"].values() for role in ("actor", "learner", "intake") if row[role]}
    assert roles == {"actor", "learner", "intake"}, run["files"]
    assert run["files"]["zmqrl/transport/decoding.py"]["intake"] > 0, "the intake decodes"
    assert run["updates"] > 0 and "executed code lines" in done.stdout
    by_package = dict(sample_path.by_package(run["files"]))
    assert sum(by_package.values()) == run["lines"] and by_package["transport"] > 0, by_package
