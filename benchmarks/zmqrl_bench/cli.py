"""``zmqrl bench``: run the benchmark parts, print their table of ratios, write it as JSON.

Each part is a module ``zmqrl_bench.<name>`` with ``run(settings) -> list[Comparison]``, imported
by name only when it runs, so a part still being written (or one whose extra dependencies are
not installed) is skipped with a line rather than breaking the command. A part may say how long
it takes as ``SECONDS = (full, quick)``, for its progress line.

Missing a target is a result, not an error: exit 0. A part that crashes prints its traceback,
the other parts still run, and the command exits 1.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
import platform
import socket
import sys
import time
import traceback
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Annotated, Any

import typer

from zmqrl.agents.configs import DEVICE_NAMES
from zmqrl_bench.report import HEADERS, BenchSettings, Comparison, markdown_table, table_rows, write_json

# Every part, in the order a full run measures them.
PARTS = (
    "actor", "learner", "ingest", "weights", "scaling", "fanin", "mlp", "captured", "replay", "atari",
    "startup",
)  # fmt: skip
# Where the results go without --json.
DEFAULT_JSON = Path("runs/bench/bench.json")
# Seconds (full, quick) for parts that do not say (SECONDS in their module).
ESTIMATES = {"learner": (95, 25)}
EXIT_FAILED, EXIT_USAGE = 1, 2

app = typer.Typer(
    add_completion=False,
    invoke_without_command=True,
    pretty_exceptions_enable=False,
    help="Measure what zmqrl costs over the bare computation, side by side in one run, and print "
    "the ratios. Parts: actor (transitions/s of a real actor vs a bare env + policy loop), learner "
    "(updates/s while ingesting vs not; APPO's updates/s on rollouts), ingest (samples into "
    "replay vs raw PUSH/PULL), weights (publish-to-applied latency vs raw PUB/SUB), scaling (1-8 "
    "actors, 32 senders, CNN learners' updates/s on --device), fanin (1-256 simulated actors at "
    "one total rate against a real learner and supervisor), mlp (the CartPole learner on --device "
    "vs a CPU core), captured (updates as CUDA graphs vs eager on --device), replay and atari; "
    "CPU-seconds per 1,000 env steps (actors) and per 1,000 "
    "updates (learner) where they run. A full run takes about 12 minutes, --quick about 2. Missed "
    "targets are results (exit 0); a part that crashes makes the exit code 1.",
    epilog="Example: zmqrl bench --quick --only actor,ingest --json runs/bench/quick.json",
)


def parse_only(only: str | None) -> list[str]:
    """The parts ``--only`` names, in measuring order; exits 2 naming the valid ones on a typo."""
    if only is None:
        return list(PARTS)
    names = [name.strip() for name in only.split(",") if name.strip()]
    unknown = [name for name in names if name not in PARTS]
    if unknown or not names:
        what = f"unknown part(s) {', '.join(map(repr, unknown))}" if unknown else "no part named"
        typer.echo(f"error: --only: {what}; choose from {', '.join(PARTS)} (comma-separated)", err=True)
        raise typer.Exit(EXIT_USAGE)
    return [name for name in PARTS if name in names]


def parse_actors(actors: str | None) -> tuple[int, ...] | None:
    """The actor counts ``--actors`` names (``1,2,4,8,16``); exits 2 on anything but positive
    integers."""
    if actors is None:
        return None
    try:
        counts = tuple(int(part) for part in actors.split(",") if part.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        typer.echo(
            f"error: --actors: expected positive integers separated by commas, got {actors!r}", err=True
        )
        raise typer.Exit(EXIT_USAGE)
    return counts


def check_device(device: str | None) -> None:
    """Exits 2 with one line when ``--device`` is unknown or names a device this machine lacks:
    a bench that asked for a GPU must not quietly measure a CPU."""
    if device is None:
        return
    if device not in DEVICE_NAMES:
        typer.echo(f"error: --device: expected one of {', '.join(DEVICE_NAMES)}, got {device!r}", err=True)
        raise typer.Exit(EXIT_USAGE)
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "no CUDA support"
            typer.echo(
                f"error: --device cuda: torch {torch.__version__} ({build}) sees no CUDA device on this "
                "machine; use --device cpu or auto",
                err=True,
            )
            raise typer.Exit(EXIT_USAGE)


def load_part(name: str) -> ModuleType | None:
    """``zmqrl_bench.<name>``, or None when that module does not exist (an import error inside
    an existing module is a crash, and raises)."""
    module = f"zmqrl_bench.{name}"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name == module:
            return None
        raise


def _estimate(name: str, module: ModuleType, quick: bool) -> str:
    seconds = getattr(module, "SECONDS", None) or ESTIMATES.get(name)
    return f"about {seconds[1 if quick else 0]} s" if seconds else "time unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_meta() -> dict[str, Any]:
    """Where and with what the numbers were measured (README numbers name their machine)."""
    import zmq

    return {
        "date": datetime.now().astimezone().isoformat(timespec="seconds"),
        "hostname": socket.gethostname(),
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": _version("torch"),
        "numpy": _version("numpy"),
        "pyzmq": zmq.__version__,
        "libzmq": zmq.zmq_version(),
        "zmqrl": _version("zmqrl"),
    }


def print_results(comparisons: list[Comparison]) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console(highlight=False)
    if not console.is_terminal:  # a log or a pipe: room for the whole table
        console = Console(highlight=False, width=200)
    table = Table(*(h or "result" for h in HEADERS), title="zmqrl bench")
    styles = {"MISSED": "bold red", "ok": "green"}
    for row in table_rows(comparisons):
        table.add_row(*row[:-1], Text(row[-1], style=styles.get(row[-1], "")))
    console.print(table)
    for c in comparisons:
        if c.passed is False:
            bound = "at least" if c.higher_is_better else "at most"
            console.print(
                f"[bold red]MISSED[/]: {c.group}: {c.name}: {c.ratio:.2f}x, target {bound} {c.target:g}x",
                markup=True,
            )


def run_parts(names: list[str], settings: BenchSettings) -> tuple[list[Comparison], dict[str, Any]]:
    """Run each part in turn; returns every comparison and what happened to each part."""
    comparisons: list[Comparison] = []
    outcome: dict[str, Any] = {"ran": [], "skipped": [], "failed": [], "seconds": {}}
    for name in names:
        started = time.monotonic()
        try:
            module = load_part(name)
            if module is None:
                typer.echo(f"{name}: skipped (zmqrl_bench.{name} does not exist yet)")
                outcome["skipped"].append(name)
                continue
            typer.echo(f"{name}: measuring ({_estimate(name, module, settings.quick)})...")
            results = list(module.run(settings))
        except Exception:
            traceback.print_exc()
            typer.echo(f"{name}: FAILED after {time.monotonic() - started:.0f} s (traceback above)", err=True)
            outcome["failed"].append(name)
            continue
        elapsed = time.monotonic() - started
        outcome["ran"].append(name)
        outcome["seconds"][name] = round(elapsed, 1)
        comparisons += results
        typer.echo(
            f"{name}: done in {elapsed:.0f} s ({len(results)} result{'s' if len(results) != 1 else ''})"
        )
    return comparisons, outcome


@app.callback()
def bench(
    ctx: typer.Context,
    quick: Annotated[
        bool, typer.Option("--quick", help="A smoke run of about a minute: fewer, shorter repeats.")
    ] = False,
    only: Annotated[
        str | None,
        typer.Option(
            "--only", metavar="PARTS", help=f"Run only these parts (comma-separated): {', '.join(PARTS)}."
        ),
    ] = None,
    json_path: Annotated[
        Path,
        typer.Option("--json", metavar="PATH", help="Write the results and the machine's details here."),
    ] = DEFAULT_JSON,
    markdown: Annotated[
        Path | None,
        typer.Option("--markdown", metavar="PATH", help="Also write the table as markdown (README style)."),
    ] = None,
    actors: Annotated[
        str | None,
        typer.Option(
            "--actors",
            metavar="COUNTS",
            help="Actor counts of the scaling runs, e.g. 1,2,4,8,16 (default 1,2,4,8; --quick: 2).",
        ),
    ] = None,
    device: Annotated[
        str | None,
        typer.Option(
            "--device",
            metavar="DEVICE",
            help="The learner's device in the scaling part (its runs and the CNN learners): auto, "
            "cpu or cuda (default: each config's own). A device this machine lacks exits 2.",
        ),
    ] = None,
) -> None:
    """Each row is zmqrl's real code and the same work done without it, measured alternately in
    the same run (medians, with min-max over the repeats), and the ratio against its target.
    (The help shown is the app's ``help``.)"""
    if ctx.invoked_subcommand is not None:
        return
    names = parse_only(only)
    counts = parse_actors(actors)
    check_device(device)
    settings = dataclasses.replace(BenchSettings.make(quick), actors=counts, device=device)
    started = time.monotonic()
    comparisons, outcome = run_parts(names, settings)
    if comparisons:
        print_results(comparisons)
    command = (
        "zmqrl bench"
        + (" --quick" if quick else "")
        + (f" --only {','.join(names)}" if only else "")
        + (f" --actors {','.join(map(str, counts))}" if counts else "")
        + (f" --device {device}" if device else "")
    )
    meta = {
        **machine_meta(),
        "command": command,
        "argv": sys.argv,
        "quick": quick,
        "repeats": settings.repeats,
        "seconds_per_measurement": settings.seconds,
        "actors": list(counts) if counts else None,
        "device": device,
        "total_seconds": round(time.monotonic() - started, 1),
        **outcome,
    }
    write_json(json_path, comparisons, meta)
    typer.echo(f"results in {json_path}")
    if markdown is not None:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(markdown_table(comparisons) + "\n")
        typer.echo(f"table in {markdown}")
    if outcome["failed"]:
        typer.echo(f"error: part(s) failed: {', '.join(outcome['failed'])}", err=True)
        raise typer.Exit(EXIT_FAILED)


def _register_extras() -> None:
    """``zmqrl bench solve`` (time-to-solve against Stable-Baselines3), where that module exists."""
    solve = load_part("solve")
    if solve is not None:
        solve.register(app)


_register_extras()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
