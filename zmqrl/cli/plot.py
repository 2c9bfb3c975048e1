"""``zmqrl plot``: return curves of one or more runs as an image, from their metrics.jsonl.

zmqrl/cli/app.py adds it to the app (:func:`register`). matplotlib (the ``plot`` extra) is
imported only when the command runs, so the rest of the CLI never needs it.
"""

from __future__ import annotations

import logging
from enum import Enum
from pathlib import Path
from typing import Annotated

import typer

from zmqrl.cli.options import EXIT_CONFIG, EXIT_RUNTIME, fail, require_writable


class XAxis(str, Enum):
    steps = "steps"
    time = "time"
    both = "both"


def register(app: typer.Typer) -> None:
    """Adds ``plot`` to ``app``, with the example its help ends with."""
    app.command(
        short_help="Plot train and eval return of runs against env steps and wall time (metrics.jsonl).",
        epilog="Example: zmqrl plot runs/cartpole_dqn runs/cartpole_dqn-2 -o curves.png",
    )(plot)


def plot(
    run_dirs: Annotated[
        list[Path], typer.Argument(help="Run directories (each with a metrics.jsonl), e.g. runs/NAME.")
    ],
    output: Annotated[
        Path,
        typer.Option("--output", "-o", help="Image to write; its suffix picks the format (png, svg, pdf)."),
    ] = Path("curves.png"),
    x: Annotated[
        XAxis,
        typer.Option("--x", help="Horizontal axis: env steps, seconds since launch, or both side by side."),
    ] = XAxis.both,
    title: Annotated[str | None, typer.Option("--title", help="Figure title (default: the env id).")] = None,
    smooth: Annotated[
        int,
        typer.Option("--smooth", min=1, help="Training episodes averaged into each point of the train line."),
    ] = 20,
) -> None:
    """Plot training and evaluation return against env steps and against seconds since launch.
    Runs whose configs differ only in run.* (seeds) are drawn as one mean line with a shaded min-max
    band; other settings get a line each, labelled by what differs; learner.target_return, when set,
    is a dotted line. Needs matplotlib: pip install 'zmqrl\\[plot]'."""
    from zmqrl.cli.plotting import PlotError, draw, require_matplotlib

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        require_matplotlib()
    except PlotError as exc:
        fail(str(exc), EXIT_RUNTIME)
    require_writable(output.parent, "--output")
    try:
        groups = draw(run_dirs, output, x=x.value, title=title, smooth_window=smooth)
    except PlotError as exc:
        fail(str(exc), EXIT_CONFIG)
    runs = sum(len(g.runs) for g in groups)
    typer.echo(f"{output}: {runs} run{'s' if runs != 1 else ''} in {len(groups)} group(s)")
