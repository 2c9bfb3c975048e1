"""Every command's --help: it works, ends with an example to copy, and `zmqrl --help` stays cheap."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.main import get_command
from typer.testing import CliRunner

from tests.conftest import REPO
from zmqrl.cli.app import app

COMMANDS = [
    "launch",
    "supervise",
    "learner",
    "actor",
    "evaluator",
    "health",
    "eval",
    "keys",
    "config",
    "plot",
    "status",
    "bench",
]


def help_text(*args: str) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "100", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_the_app_has_exactly_these_commands_in_this_order() -> None:
    # The split into modules registers them; a command added without one of these tests fails here.
    group = get_command(app)
    assert group.list_commands(group.context_class(group)) == COMMANDS  # type: ignore[attr-defined]


def test_the_order_does_not_depend_on_which_cli_module_is_imported_first() -> None:
    # A library caller importing e.g. zmqrl.cli.launch first registers launch and supervise last.
    code = (
        "import zmqrl.cli.launch, typer.main, zmqrl.cli.docgen as d; from zmqrl.cli.app import app; "
        "g = typer.main.get_command(app); print(g.list_commands(g.context_class(g))); "
        "print(d.render_cli_reference() == open('docs/cli.md', encoding='utf-8').read())"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [str(COMMANDS), "True"]


@pytest.mark.parametrize("args", [(), *((name,) for name in COMMANDS)], ids=["zmqrl", *COMMANDS])
def test_every_help_exits_0_and_ends_with_an_example(args: tuple[str, ...]) -> None:
    lines = [line.strip() for line in help_text(*args).splitlines() if line.strip()]
    assert lines[-1].startswith("Example: zmqrl ") or lines[-1].startswith("Example: ZMQRL_"), lines[-1]


def test_launch_help_offers_serial_mode() -> None:
    assert "--serial" in help_text("launch")


def test_zmqrl_help_imports_no_torch() -> None:
    probe = (
        "import sys\nsys.argv = ['zmqrl', '--help']\nfrom zmqrl.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
        "assert 'torch' not in sys.modules, 'zmqrl --help imported torch'\n"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "Example:" in result.stdout
