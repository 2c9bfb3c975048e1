"""Command line: the typer app ``zmqrl``, the order of its commands, and ``main`` (the entry point).

The commands live one group per module (launch.py: ``launch | supervise``; roles.py: ``learner |
actor | evaluator | health | eval | keys | config``; export.py; plot.py; status.py; slurm.py) and are
added here, so the order of `zmqrl --help` and docs/cli.md is this module's, whatever a program
imports first. ``bench`` comes from ``zmqrl_bench.cli``, the benchmarks' package beside zmqrl (in
benchmarks/ of the source tree): this is the one module of zmqrl that imports it, and where it is
not installed ``zmqrl bench`` says so instead. Every command takes a YAML config and any number of
``--set section.key=value`` overrides. Imports here are cheap on purpose (torch only inside the
commands that train or act), so ``zmqrl --help`` and ``zmqrl health`` answer at once.
"""

from __future__ import annotations

import inspect
import re
import sys
from typing import Any

import typer
from typer.core import TyperCommand, TyperGroup

from zmqrl.cli import export, launch, plot, roles, slurm, status, tune

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


def bench_app() -> typer.Typer | None:
    """``zmqrl bench``'s command group, or None where the zmqrl_bench package is not installed (a
    runtime-only image). Only its absence counts: a bench that fails to import raises, as any bug."""
    try:
        from zmqrl_bench.cli import app as bench
    except ModuleNotFoundError as exc:
        if exc.name != "zmqrl_bench":
            raise
        return None
    return bench


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
# eval, keys, config, export, plot, status, slurm, tune, then bench (a command group of its own).
for group in (launch, roles, export, plot, status, slurm, tune):
    group.register(app)
if (bench := bench_app()) is not None:
    app.add_typer(bench, name="bench")
else:

    @app.command(
        "bench",
        add_help_option=False,
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )
    def bench_not_installed() -> None:
        """Not installed here: the benchmarks (package zmqrl_bench) ship with a source install."""
        typer.echo(
            "error: zmqrl bench is not installed here (no zmqrl_bench package: a runtime-only install); "
            "run `pip install .` (or `pip install -e .` again) in a zmqrl source checkout to get it",
            err=True,
        )
        raise typer.Exit(1)


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
