"""Every command's --help: it works, ends with an example to copy, reads as sentences, and `zmqrl
--help` stays cheap."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from typing import Any

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
    "export",
    "plot",
    "status",
    "slurm",
    "tune",
    "bench",
]


# A terminal wide enough that no paragraph of any help needs wrapping: every line break left in the
# output is then one the text itself asked for.
WIDE = 1000
# The box drawing around rich's panels.
BORDERS = "│╭╮╰╯─ "


def help_text(*args: str, columns: int = 100) -> str:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": str(columns), "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def every_help() -> list[tuple[tuple[str, ...], Any]]:
    """``(args, click command)`` for `zmqrl` and every command and sub-command under it."""
    found: list[tuple[tuple[str, ...], Any]] = []

    def walk(args: tuple[str, ...], command: Any) -> None:
        found.append((args, command))
        for name, child in getattr(command, "commands", {}).items():
            walk((*args, name), child)

    walk((), get_command(app))
    return found


def as_printed(paragraph: str) -> str:
    """A help paragraph with its words on one line, as rich prints it (``\\[`` is an escaped ``[``)."""
    return " ".join(paragraph.split()).replace("\\[", "[")


def shown_lines(args: tuple[str, ...]) -> list[str]:
    """The lines of a help at WIDE columns, without the panels' borders and padding."""
    return [line.strip(BORDERS) for line in help_text(*args, columns=WIDE).splitlines()]


def test_the_app_has_exactly_these_commands_in_this_order() -> None:
    # The split into modules registers them; a command added without one of these tests fails here.
    group = get_command(app)
    assert group.list_commands(group.context_class(group)) == COMMANDS  # type: ignore[attr-defined]


def test_the_order_does_not_depend_on_which_cli_module_is_imported_first() -> None:
    # A library caller importing e.g. zmqrl.cli.launch first registers launch and supervise last.
    code = (
        "import zmqrl.cli.launch, typer.main; from tests.scripts import load_script; "
        "d = load_script('docgen'); from zmqrl.cli.app import app; "
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


HELPS = every_help()


@pytest.mark.parametrize(("args", "command"), HELPS, ids=[" ".join(("zmqrl", *a)) for a, _ in HELPS])
def test_every_paragraph_of_a_help_is_printed_on_one_line(args: tuple[str, ...], command: Any) -> None:
    """A docstring's line breaks are the source's wrapping, not the reader's: on a terminal wide
    enough for any paragraph, each paragraph of the help (words as written, blank lines between
    paragraphs) is one line of `--help`, and the first one is one line of the parent's command list."""
    lines = shown_lines(args)
    text = command.help or ""
    for paragraph in re.split(r"\n\s*\n", text.strip()):
        assert any(as_printed(paragraph) in line for line in lines), (
            f"zmqrl {' '.join(args)} --help breaks this paragraph across lines:\n{as_printed(paragraph)}"
        )
    if args:
        summary = as_printed(command.short_help or re.split(r"\n\s*\n", text.strip())[0])
        listing = shown_lines(args[:-1])
        assert any(line.startswith(args[-1]) and line.endswith(summary) for line in listing), (
            f"zmqrl {' '.join(args[:-1])} --help breaks the summary of {args[-1]!r} across lines"
        )


@pytest.mark.parametrize(("args", "command"), HELPS, ids=[" ".join(("zmqrl", *a)) for a, _ in HELPS])
def test_every_option_and_argument_help_is_printed_as_written(args: tuple[str, ...], command: Any) -> None:
    """rich reads ``[text]`` as markup and drops it: a default written as ``[runs/tune/STUDY]``
    vanished from `zmqrl tune --help`, leaving "best.yaml ." (escape it as ``\\[``)."""
    shown = "\n".join(shown_lines(args))
    for param in command.params:
        text = getattr(param, "help", None)
        if text:
            assert as_printed(text) in shown, f"zmqrl {' '.join(args)} --help: {param.name}'s help is cut"


def continued_lines(args: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(line, next line)`` of a help at WIDE columns wherever the next line goes on with the same
    text: the next line of a paragraph, or in a panel a line that continues a cell (indented past
    the first column) rather than starting a new row. Panel edges and blank lines end a block."""
    pairs: list[tuple[str, str]] = []
    raw = help_text(*args, columns=WIDE).splitlines()
    for line, after in itertools.pairwise(raw):
        if not line.strip(BORDERS) or not after.strip(BORDERS) or after.lstrip()[:1] in ("╭", "╰"):
            continue
        if line.lstrip()[:1] in ("╭", "╰"):
            continue
        if after.startswith("│") and not after.startswith("│  "):
            continue  # a new row of a panel's table
        pairs.append((line.strip(BORDERS), after.strip(BORDERS)))
    return pairs


@pytest.mark.parametrize("args", [args for args, _ in HELPS], ids=[" ".join(("zmqrl", *a)) for a, _ in HELPS])
def test_no_line_of_a_help_breaks_mid_sentence(args: tuple[str, ...]) -> None:
    """Whatever the text (docstrings, option help, epilogs), on a WIDE terminal no printed line ends
    mid-sentence (on a word or a comma) while the next line of the same text goes on in lowercase."""
    for line, after in continued_lines(args):
        if after[:1].islower():
            assert not re.search(r"[\w,]$", line), f"zmqrl {' '.join(args)} --help:\n{line}\n{after}"


def test_help_is_re_flowed_once_at_the_root_of_the_command_tree() -> None:
    """The source's wrapping is gone from every help typer builds, docs/cli.md's included."""
    for args, command in HELPS:
        for paragraph in (command.help or "").split("\n\n"):
            assert "\n" not in paragraph, f"zmqrl {' '.join(args)}: a line break inside a paragraph"


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


@pytest.mark.parametrize("args", [["bench", "--quick", "--only", "actor"], ["bench", "--help"]])
def test_bench_where_its_package_is_not_installed_says_so_in_one_line(args: list[str]) -> None:
    """A runtime-only install (the container image copies zmqrl/ alone) has no zmqrl_bench: the rest
    of the CLI works, `zmqrl --help` still lists bench, and `zmqrl bench` exits 1 saying what to do."""
    probe = (
        "import sys\n"
        "class NotInstalled:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.partition('.')[0] == 'zmqrl_bench':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NotInstalled())\n"
        f"sys.argv = ['zmqrl', *{args!r}]\nfrom zmqrl.cli.app import main\nmain()\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("error: zmqrl bench is not installed here"), done.stderr
    assert "pip install ." in done.stderr
    listed = subprocess.run(
        [sys.executable, "-c", probe.replace(repr(args), "['--help']")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"bench +Not installed here", listed.stdout), listed.stdout
