"""Repository hygiene that packaging and users rely on."""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def tracked_files() -> set[str]:
    out = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_the_license_that_pyproject_names_is_there() -> None:
    assert "LICENSE" in tracked_files()
    assert 'license = { file = "LICENSE" }' in (REPO / "pyproject.toml").read_text()
    assert "MIT License" in (REPO / "LICENSE").read_text()


def test_the_package_declares_its_type_hints() -> None:
    assert "zmqrl/py.typed" in tracked_files()
    assert 'zmqrl = ["py.typed"]' in (REPO / "pyproject.toml").read_text()


def test_no_run_artefacts_are_committed() -> None:
    files = tracked_files()
    assert "MUJOCO_LOG.TXT" not in files
    assert not [f for f in files if f.startswith("runs/")]
