"""Command line: the typer app, the helpers every command shares, and ``main`` (the entry point).

Commands: ``zmqrl launch | supervise`` (training, in cli_launch.py) and ``zmqrl learner | actor |
evaluator | health | eval | keys | config`` (one role or one tool, in cli_roles.py); both modules
register on ``app`` below. Every command takes a YAML config and any number of ``--set
section.key=value`` overrides. Process mains stay thin: parse config, build the role, run it,
clean up, report. Imports here are cheap on purpose (torch only inside the commands that train or
act), so ``zmqrl --help`` and ``zmqrl health`` answer at once.
"""

from __future__ import annotations

import time

# Before the heavier imports: "N s after launch" in the summary counts from here.
COMMAND_STARTED = time.time()

import difflib
import enum
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

# Exit codes (docs/fault-tolerance.md "Exit codes"): 0 ok, 1 runtime failure, 2 bad config or usage;
# a role stopped by signal N exits 128 + N (zmqrl/supervisor/restarts.py has the whole table).
EXIT_RUNTIME, EXIT_CONFIG = 1, 2
SIGNAL_EXIT_BASE = 128
# How often the thread that passes a stop signal on to the role looks for one (seconds).
SIGNAL_POLL_SECONDS = 0.1

# One log record, one line: when (to the millisecond), how bad, which process (the same name as its
# log file, runs/NAME/logs/ROLE-ID.log), which module, what. Tracebacks follow on their own lines.
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s {label} %(name)s: %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"
# The config file suggested when the one given is missing or a directory.
EXAMPLE_CONFIG = "configs/cartpole_dqn.yaml"
# At most this many "did you mean" file names for a config path that does not exist.
CLOSE_CONFIG_NAMES = 3

# The order of `zmqrl --help` and docs/cli.md. Each cli_* module registers its commands when it is
# imported, and importing one of them first (``from zmqrl.cli.launch import ...``) runs this
# module's imports at its bottom before that module's own commands exist: so the order is fixed
# here, not left to import order.
COMMAND_ORDER = (
    *("launch", "supervise", "learner", "actor", "evaluator", "health"),
    *("eval", "keys", "config", "plot", "status", "bench"),
)


class OrderedGroup(TyperGroup):
    """Lists the commands in COMMAND_ORDER (any others after them, as registered)."""

    def list_commands(self, ctx: Any) -> list[str]:
        names = super().list_commands(ctx)
        rank = {name: i for i, name in enumerate(COMMAND_ORDER)}
        return sorted(names, key=lambda name: (rank.get(name, len(rank)), names.index(name)))


app = typer.Typer(
    cls=OrderedGroup,
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # plain tracebacks: short, and never dumping local variables
    help="zmqrl: asynchronous reinforcement learning over ZeroMQ. Many CPU actors sample, one learner "
    "trains from replay and publishes weights, a supervisor keeps them running. Start with "
    "`zmqrl launch configs/cartpole_dqn.yaml`. Every command takes a YAML config and repeatable "
    "`--set section.key=value` overrides; `zmqrl config FILE` prints the resolved config.",
    epilog="Example: zmqrl launch configs/cartpole_dqn.yaml --set run.seed=1",
)

ConfigArg = Annotated[
    Path, typer.Argument(help="YAML config file (see configs/ and README 'Configuration').")
]
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
        "warning): only on a trusted network. See README 'Security'.",
    ),
]


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load(config: Path, overrides: list[str] | None, log_level: LogLevel | None = None) -> Any:
    """The resolved config, or exit 2 with one line. ``--log-level`` is applied last, after every
    ``--set``, so it wins; in ``launch`` it reaches the children through the saved config.yaml."""
    from zmqrl.config import ConfigError, load_config

    problem = config_path_problem(config)
    if problem is not None:
        _fail(problem, EXIT_CONFIG)
    if log_level is not None:
        overrides = [*(overrides or []), f"run.log_level={log_level.value}"]
    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        _fail(" ".join(str(exc).split()), EXIT_CONFIG)


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


class _Logging:
    """The one handler ``_setup_logging`` installed (replaced when the label changes)."""

    handler: logging.Handler | None = None


def _setup_logging(level: str, label: str) -> None:
    """Log to stderr, one line a record, labelled ``label`` (``actor-3``: the process's log file
    name; ``supervisor``, ``serial``). Under a supervisor, stderr *is* runs/NAME/logs/LABEL.log.

    A program that configured logging itself (a test harness, an embedding application) keeps its
    handlers: as with ``logging.basicConfig``, nothing is added then.
    """
    root = logging.getLogger()
    if _Logging.handler is not None:
        root.removeHandler(_Logging.handler)
        _Logging.handler = None
    if root.handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter(LOG_FORMAT.format(label=label.replace("%", "%%")), LOG_DATE_FORMAT)
    )
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper()))
    _Logging.handler = handler
    logging.getLogger("zmqrl").debug(
        "pid %d: zmqrl %s (log level %s)", os.getpid(), shlex.join(sys.argv[1:]), level
    )


def _on_stop_signals(request_stop: Callable[[], None], received: list[int] | None = None) -> None:
    """First SIGINT/SIGTERM asks the role to stop cleanly; a second SIGINT interrupts at once.
    Each signal's number is appended to ``received``, for an exit code that says which it was.

    The handler only records the signal: one that logs, or sets an Event (which takes a lock),
    deadlocks when the signal lands while the main thread holds that lock. A daemon thread passes
    the first signal on to the role (``request_stop``) and logs it, within SIGNAL_POLL_SECONDS."""
    if threading.current_thread() is not threading.main_thread():
        return
    got: list[int] = received if received is not None else []

    def handler(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and got:
            raise KeyboardInterrupt
        got.append(signum)

    def relay() -> None:
        while not got:
            time.sleep(SIGNAL_POLL_SECONDS)
        logging.getLogger("zmqrl").info("%s: stopping cleanly", signal.Signals(got[0]).name)
        request_stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    threading.Thread(target=relay, name="stop-signal", daemon=True).start()


def role_exit_code(stats: dict[str, Any], received: list[int]) -> int:
    """A role command's exit code: 128 + N when signal N stopped it (a stop nobody in the run
    asked for: a supervisor restarts it), 1 when it ended failed, else 0 (finished, or stopped
    because the supervisor or the learner asked)."""
    if received:
        return SIGNAL_EXIT_BASE + received[0]
    return EXIT_RUNTIME if stats.get("state") == "failed" else 0


def _run_role(make: Callable[[], Any], received: list[int] | None = None) -> dict[str, Any]:
    """Build and run a role. Settings that cannot work (the ConfigError family, whether found while
    building or deep inside ``run()``) exit 2 with one line; a port in use or unusable keys exit 1
    with one line, as does an actor that could not reach its learner; anything else is a bug and
    propagates: a traceback in the log, exit 1. Stop signals go to ``received`` (see above)."""
    from zmqrl.envs.factory import EnvError
    from zmqrl.errors import ConfigError
    from zmqrl.replay.memory import ReplayMemoryError
    from zmqrl.transport.channels import LearnerUnreachable
    from zmqrl.transport.keys import SecurityError
    from zmqrl.transport.sockets import BindError

    try:
        role = make()
        _on_stop_signals(role.request_stop, received)
        return dict(role.run())
    except (ConfigError, EnvError, ReplayMemoryError) as exc:
        _fail(" ".join(str(exc).split()), EXIT_CONFIG)
    except (BindError, SecurityError, LearnerUnreachable) as exc:
        _fail(" ".join(str(exc).split()), EXIT_RUNTIME)


def _start_link(cfg: Any, role: str, role_id: int) -> Any:
    """First thing in a role's process, before torch is imported: its heartbeat thread (so the
    supervisor hears it within a second of its start) with the watchdog that ends a hung process
    (exit 3), the guard that turns any thread's death into the process's, and the parent-death
    signal when a supervisor started it."""
    from zmqrl.runtime.guard import install_process_guard
    from zmqrl.runtime.link import SupervisorLink, die_with_parent
    from zmqrl.transport.keys import SecurityError

    install_process_guard()
    die_with_parent()
    import zmq

    try:
        return SupervisorLink(zmq.Context.instance(), cfg, role, role_id, watchdog=True)
    except SecurityError as exc:
        _fail(" ".join(str(exc).split()), EXIT_RUNTIME)


def main() -> None:
    app()


# The commands register themselves on ``app`` when imported, in this order in `zmqrl --help`:
# launch, supervise (cli_launch), then learner, actor, evaluator, health, eval, keys, config,
# then plot (cli_plot), then status (cli_status), then bench (zmqrl.bench.cli, a command group).
from zmqrl.cli import launch, roles  # noqa: F401

# isort: split
from zmqrl.cli import plot  # noqa: F401

# isort: split
from zmqrl.cli import status  # noqa: F401

# isort: split
from zmqrl.bench.cli import app as bench_app

app.add_typer(bench_app, name="bench")

if __name__ == "__main__":
    main()
