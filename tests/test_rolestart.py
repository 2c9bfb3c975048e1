"""The supervisor starts its roles with ``python -m zmqrl.cli.rolestart``: the role commands without
typer's start-up (pydantic, the whole command tree), which understands exactly the arguments the
supervisor writes and nothing else."""

from __future__ import annotations

import itertools
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO
from zmqrl.cli.rolestart import EXIT_USAGE, main, parse
from zmqrl.supervisor.processes import role_command

CONFIG = Path("runs/t/config.yaml")


@pytest.mark.parametrize(
    ("role", "replacement", "resume"),
    list(itertools.product(("learner", "actor", "evaluator"), (False, True), (False, True))),
)
def test_every_command_the_supervisor_writes_is_understood(
    role: str, replacement: bool, resume: bool
) -> None:
    cmd = role_command(role, 3, CONFIG, replacement=replacement, resume=resume)
    assert cmd[:3] == [sys.executable, "-m", "zmqrl.cli.rolestart"]
    parsed = parse(cmd[3:])
    assert parsed is not None
    got_role, config, flags, actor_id = parsed
    assert (got_role, config) == (role, CONFIG)
    if role == "actor":
        assert actor_id == "3" and flags == ({"--replacement"} if replacement else set())
    else:
        assert actor_id is None and flags == ({"--resume"} if replacement or resume else set())


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["learner"],
        ["launch", "c.yaml"],
        ["learner", "--resume"],
        ["learner", "c.yaml", "--replacement"],
        ["learner", "c.yaml", "--resume", "--resume"],
        ["learner", "c.yaml", "--set", "learner.max_updates=1"],
        ["actor", "c.yaml", "--id"],
        ["actor", "c.yaml", "--id", "auto"],
        ["actor", "c.yaml", "--id", "-1"],
        ["actor", "c.yaml", "--resume"],
        ["evaluator", "c.yaml", "--id", "0"],
    ],
)
def test_anything_else_is_a_usage_error_that_points_at_the_real_command(
    args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert parse(args) is None
    assert main(args) == EXIT_USAGE
    err = capsys.readouterr().err
    assert (
        err.startswith("usage: python -m zmqrl.cli.rolestart")
        and "zmqrl learner|actor|evaluator --help" in err
    )


def test_a_role_started_so_exits_as_its_command_does_without_importing_pydantic(tmp_path: Path) -> None:
    """A missing config is the role command's own error (exit 2, one line), reached without the
    typer start-up that imported pydantic before any role ran (~65 ms of every role's start)."""
    script = textwrap.dedent(
        f"""
        import sys
        from zmqrl.cli.rolestart import main
        code = main(["learner", {str(tmp_path / "missing.yaml")!r}])
        print(code, "pydantic" in sys.modules)
        """
    )
    child = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert child.stdout.split() == ["2", "False"], child.stdout + child.stderr
    assert "missing.yaml: config file not found" in child.stderr
