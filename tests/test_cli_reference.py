"""docs/cli.md is generated from the typer app and current; every command's help ends with an example."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.scripts import load_script

docgen = load_script("docgen")

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "docs" / "cli.md"
COMMANDS = [name for name, _ in docgen.cli_commands()]


def test_docs_cli_md_is_not_stale() -> None:
    """Fails whenever a command, option, default or help text changed without regenerating."""
    assert REFERENCE.read_text(encoding="utf-8") == docgen.render_cli_reference(), (
        "docs/cli.md is stale: run python benchmarks/docgen.py"
    )


@pytest.mark.parametrize("name", COMMANDS)
def test_every_command_has_an_example_line_and_a_section(name: str) -> None:
    command = dict(docgen.cli_commands())[name]
    assert (command.epilog or "").startswith("Example: "), f"zmqrl {name} has no 'Example: ...' epilog"
    text = REFERENCE.read_text(encoding="utf-8")
    section = text[text.index(f"\n## zmqrl {name}\n") :]
    assert f"```\nzmqrl {name} [OPTIONS]" in section
    assert "Example:\n\n```\n" + command.epilog.removeprefix("Example: ") in section


def test_the_reference_lists_every_option_of_every_command_with_its_default() -> None:
    text = REFERENCE.read_text(encoding="utf-8")
    assert "| `-e, --episodes <int>` | Greedy episodes to play.  [default: 10] |" in text
    assert "| `--log-level <debug\\|info\\|warning\\|error>` |" in text  # a `|` would split the cell
    for name, command in docgen.cli_commands():
        section = text[text.index(f"\n## zmqrl {name}\n") :]
        for param in command.params:
            for opt in param.opts:
                if opt.startswith("--"):
                    assert opt in section, f"zmqrl {name}: {opt} missing from docs/cli.md"


def test_the_reference_does_not_depend_on_the_terminal_width() -> None:
    """Rendered in processes with narrow and wide terminals: the same text."""
    code = (
        "import sys\nfrom tests.scripts import load_script\n"
        "sys.stdout.write(load_script('docgen').render_cli_reference())\n"
    )
    outputs = set()
    for columns in ("40", "200"):
        env = {"COLUMNS": columns, "PATH": "/usr/bin:/bin", "TERM": "xterm-256color"}
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
        )
        assert result.returncode == 0, result.stderr
        outputs.add(result.stdout)
    assert len(outputs) == 1


def test_check_reports_a_stale_cli_reference(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "cli.md"
    stale.write_text("# old\n")
    config = tmp_path / "configuration.md"
    config.write_text(docgen.regenerate(docgen.DEFAULT_PATH.read_text(encoding="utf-8")))
    monkeypatch.setattr(docgen, "CLI_PATH", stale)
    monkeypatch.setattr(docgen, "DEFAULT_PATH", config)
    assert docgen.main(["--check"]) == docgen.STALE
    assert stale.read_text() == "# old\n"  # --check writes nothing
    assert docgen.main([]) == 0
    assert stale.read_text() == docgen.render_cli_reference()
    assert docgen.main(["--check"]) == 0
