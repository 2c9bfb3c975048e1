"""`zmqrl health` as a container probe runs it: the same verdicts as the typer command, answered
without typer's command tree or torch (the probe ran up to 7.5 s under load against a 10 s
timeout). Behaviour only: what is imported and what is answered, not how fast."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zmqrl.cli.healthcheck import parse, verdict
from zmqrl.runtime.health import HealthRecord, write_health


def healthy_file(tmp_path: Path, state: str = "running", age: float = 0.0) -> Path:
    path = tmp_path / "health.json"
    now = time.time() - age
    write_health(path, HealthRecord("actor", 3, os.getpid(), state, now, 10, now, 3.0, 60.0))
    return path


def without_age(line: str) -> str:
    return re.sub(r"beat [0-9.]+ s ago", "beat ? s ago", line)


def run_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "ZMQRL_HEALTH_FILE"}
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=60
    )


# Prints which heavy modules the process imported, whatever the command did.
HEAVY = ("torch", "typer", "click", "zmqrl.cli.roles")
REPORT = (
    "import atexit, json, sys\n"
    f"heavy = {HEAVY!r}\n"
    "atexit.register(lambda: print(json.dumps([m for m in heavy if m in sys.modules]), file=sys.stderr))\n"
)


def test_zmqrl_health_never_builds_the_typer_app_nor_imports_torch(tmp_path: Path) -> None:
    path = healthy_file(tmp_path)
    code = (
        REPORT + "sys.argv = ['zmqrl', 'health', '--file', sys.argv[1]]\n"
        "import zmqrl.cli.app as cli\n"
        "cli.app = None  # calling typer's app would fail: the fast path must not reach it\n"
        "cli.main()\n"
    )
    done = run_python(code, str(path))
    assert done.returncode == 0, done.stderr
    assert "actor-3" in done.stdout and "healthy" in done.stdout
    assert "torch" not in json.loads(done.stderr.strip().splitlines()[-1])


def test_the_probe_module_imports_neither_typer_nor_torch(tmp_path: Path) -> None:
    path = healthy_file(tmp_path, age=10.0)  # no beat for 10 s > heartbeat_timeout: dead
    code = REPORT + "import runpy\n" + "runpy.run_module('zmqrl.cli.healthcheck', run_name='__main__')\n"
    done = run_python(code, "-f", str(path))
    assert done.returncode == 1 and done.stdout.startswith("unhealthy: actor-3"), done
    assert json.loads(done.stderr.strip().splitlines()[-1]) == [], "no torch, typer, click or CLI modules"


def test_help_and_unknown_arguments_go_to_the_typer_command(tmp_path: Path) -> None:
    assert parse(["--help"]) == (False, None)
    assert parse(["--fil", "x"]) == (False, None)
    assert parse(["-f", str(tmp_path)]) == (True, tmp_path)
    assert parse([f"--file={tmp_path}"]) == (True, tmp_path)
    done = run_python(
        "import sys; sys.argv = ['zmqrl', 'health', '--help']; from zmqrl.cli.app import main; main()"
    )
    assert done.returncode == 0 and "ZMQRL_HEALTH_FILE" in done.stdout


@pytest.mark.parametrize(
    ("state", "age", "code", "start"),
    [
        ("running", 0.0, 0, "actor-3"),
        ("finished", 0.0, 1, "unhealthy: actor-3"),
        ("running", 9.0, 1, "unhealthy"),
    ],
)
def test_verdicts_match_the_health_rules(
    tmp_path: Path, state: str, age: float, code: int, start: str
) -> None:
    got, line, error = verdict(healthy_file(tmp_path, state, age))
    assert (got, error) == (code, False) and line.startswith(start), line
    missing = verdict(tmp_path / "none.json")
    assert missing[0] == 1 and "no health file" in missing[1]


@pytest.mark.parametrize(("state", "code"), [("running", 0), ("finished", 1)])
def test_the_typer_way_gives_the_fast_ways_verdict(tmp_path: Path, state: str, code: int) -> None:
    """``-fPATH`` (click's joined short option) is not the probe's: typer's command answers it,
    with the same verdict, line and exit code."""
    path = healthy_file(tmp_path, state)
    main = "import sys; from zmqrl.cli.app import main; sys.argv = ['zmqrl', 'health', *sys.argv[1:]]; main()"
    done = run_python(main, f"-f{path}")
    want, line, _ = verdict(path)
    # The line says how long ago the beat was: it grows between the two answers, so it is blanked.
    said = (done.returncode, without_age(done.stdout.strip()))
    assert said == (want, without_age(line)) and want == code, done
    nothing = run_python(main, "-f")  # typer's own usage error: an option without its value
    assert nothing.returncode == 2 and "-f" in nothing.stderr
