"""Command line: the typer app ``zmqrl``, the order of its commands, and ``main`` (the entry point).

The commands live one group per module (launch.py: ``launch | supervise``; roles.py: ``learner |
actor | evaluator | health | eval | keys | config``; plot.py; status.py; zmqrl.bench.cli) and are
added here, so the order of `zmqrl --help` and docs/cli.md is this module's, whatever a program
imports first. Every command takes a YAML config and any number of ``--set section.key=value``
overrides. Imports here are cheap on purpose (torch only inside the commands that train or act), so
``zmqrl --help`` and ``zmqrl health`` answer at once.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from zmqrl.bench.cli import app as bench_app
from zmqrl.cli import launch, plot, roles, slurm, status, tune

# A paragraph that starts with this keeps its line breaks (click's marker for "do not re-wrap").
NO_REWRAP = "\b"


def paragraphs(text: str | None) -> list[str]:
    """A help text's paragraphs, each on one line: a docstring is wrapped for the source's width, and
    its line breaks are not sentences' ends. Blank lines separate paragraphs; one that starts with
    ``\\b`` keeps its lines; anything after ``\\f`` is not help (as in click)."""
    if not text:
        return []
    body = inspect.cleandoc(text).partition("\f")[0]
    chunks = (chunk.strip("\n") for chunk in re.split(r"\n[ \t]*\n", body))
    return [chunk if chunk.startswith(NO_REWRAP) else " ".join(chunk.split()) for chunk in chunks if chunk]


def reflow_help(command: TyperCommand | TyperGroup) -> None:
    """Re-flows the help of ``command`` and of every command under it, in place (see
    :func:`paragraphs`), so that `--help` breaks lines only where the terminal is full."""
    if command.help:
        command.help = "\n\n".join(paragraphs(command.help))
    for child in getattr(command, "commands", {}).values():
        reflow_help(child)


class ProseGroup(TyperGroup):
    """``zmqrl``'s command group: every help text under it reads as sentences at any width.

    typer's rich help keeps a docstring's single line breaks (the first paragraph's in the list of
    commands, all of them in a command's own help), so a sentence wrapped at column 100 of the
    source broke mid-line on every terminal. Re-flowing once, here where typer builds the command
    tree, covers every command, the ``bench`` group added from elsewhere, and docs/cli.md (which is
    read from the same tree).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        reflow_help(self)


app = typer.Typer(
    cls=ProseGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # plain tracebacks: short, and never dumping local variables
    help="zmqrl: asynchronous reinforcement learning over ZeroMQ. Many CPU actors sample, one learner "
    "trains from replay and publishes weights, a supervisor keeps them running. Start with "
    "`zmqrl launch configs/cartpole_dqn.yaml`. Every command takes a YAML config and repeatable "
    "`--set section.key=value` overrides; `zmqrl config FILE` prints the resolved config.",
    epilog="Example: zmqrl launch configs/cartpole_dqn.yaml --set run.seed=1",
)

# The order of `zmqrl --help` and docs/cli.md: launch, supervise, learner, actor, evaluator, health,
# eval, keys, config, plot, status, slurm, tune, then bench (a command group of its own).
for group in (launch, roles, plot, status, slurm, tune):
    group.register(app)
app.add_typer(bench_app, name="bench")


def main() -> None:
    # A container's health probe, every few seconds in a busy container: answered without
    # building typer's command tree (zmqrl/cli/healthcheck.py says why).
    if sys.argv[1:2] == ["health"]:
        from zmqrl.cli.healthcheck import main as health

        code = health(sys.argv[2:])
        if code is not None:
            sys.exit(code)
    app()


if __name__ == "__main__":
    main()
