"""What every command shares: its exit codes, the config argument, the ``--set``, ``--log-level``
and ``--insecure`` options, and reading the config (or one ``error:`` line and exit 2).

Imports here are cheap on purpose (the config module only inside :func:`load`), so that
``zmqrl --help`` answers at once.
"""

from __future__ import annotations

import difflib
import enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

if TYPE_CHECKING:
    from zmqrl.config import Config

# Exit codes (docs/fault-tolerance.md "Exit codes"): 0 ok, 1 runtime failure, 2 bad config or usage;
# a role stopped by signal N exits 128 + N (zmqrl/supervisor/restarts.py has the whole table).
EXIT_RUNTIME, EXIT_CONFIG = 1, 2
# The config file suggested when the one given is missing or a directory.
EXAMPLE_CONFIG = "configs/cartpole_dqn.yaml"
# At most this many "did you mean" file names for a config path that does not exist.
CLOSE_CONFIG_NAMES = 3

ConfigArg = Annotated[Path, typer.Argument(help="YAML config file (see configs/ and docs/configuration.md).")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="SECTION.KEY=VALUE",
        help="Override one config value, e.g. --set learner.max_updates=5000 (repeatable).",
    ),
]


class LogLevel(str, enum.Enum):
    """The values of ``--log-level`` (and of ``run.log_level``)."""

    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


LogLevelOpt = Annotated[
    LogLevel | None,
    typer.Option(
        "--log-level",
        case_sensitive=False,
        help="Log records at this level and above (overrides run.log_level; `launch` passes it on to "
        "every process it starts, through the run's saved config).",
    ),
]
InsecureOpt = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Allow binding a non-loopback address without Curve keys (prints a "
        "warning): only on a trusted network. See docs/deployment.md 'Security'.",
    ),
]


def fail(message: str, code: int) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def load(config: Path, overrides: list[str] | None, log_level: LogLevel | None = None) -> Config:
    """The resolved config, or exit 2 with one line. ``--log-level`` is applied last, after every
    ``--set``, so it wins; in ``launch`` it reaches the children through the saved config.yaml."""
    from zmqrl.config import ConfigError, load_config

    problem = config_path_problem(config)
    if problem is not None:
        fail(problem, EXIT_CONFIG)
    if log_level is not None:
        overrides = [*(overrides or []), f"run.log_level={log_level.value}"]
    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        fail(" ".join(str(exc).split()), EXIT_CONFIG)


def require_writable(folder: Path, setting: str = "run.dir") -> None:
    """Exit 2 with one line when ``folder`` cannot be made and written (a file in its way, a folder
    this user may not write): before a command writes anything there, not a traceback from its
    first write. ``setting``: what the user changes to fix it."""
    from zmqrl.runtime.finished import run_dir_problem

    if problem := run_dir_problem(folder, setting):
        fail(problem, EXIT_CONFIG)


def config_path_problem(path: Path) -> str | None:
    """Why ``path`` cannot be a config file (a directory; missing, with the closest YAML names next
    to it), or None. Checked before parsing so the line says what to give instead."""
    if path.is_dir():
        return f"{path}: is a directory, not a config file; give a YAML file, e.g. {EXAMPLE_CONFIG}"
    if path.exists():
        return None
    folder = path.parent
    names = [p.name for p in folder.glob("*.y*ml")] if folder.is_dir() else []
    matches = difflib.get_close_matches(path.name, sorted(names), n=CLOSE_CONFIG_NAMES)
    if matches:
        hint = "did you mean " + ", ".join(str(folder / name) for name in matches) + "?"
    elif not folder.is_dir():
        hint = f"no directory {folder}"
    else:
        hint = f"the configs that ship with zmqrl are in configs/, e.g. {EXAMPLE_CONFIG}"
    return f"{path}: config file not found ({hint})"
