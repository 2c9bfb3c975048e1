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

import logging
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

# Exit codes (documented in README): 0 ok, 1 runtime failure, 2 bad config or usage.
EXIT_RUNTIME, EXIT_CONFIG = 1, 2

app = typer.Typer(
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


def _load(config: Path, overrides: list[str] | None) -> Any:
    from zmqrl.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        _fail(str(exc), EXIT_CONFIG)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _on_stop_signals(request_stop: Callable[[], None], received: list[int] | None = None) -> None:
    """First SIGINT/SIGTERM asks the role to stop cleanly; a second SIGINT interrupts at once.
    Each signal's number is appended to ``received``, for an exit code that says which it was."""

    def handler(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and getattr(handler, "seen", False):
            raise KeyboardInterrupt
        handler.seen = True  # type: ignore[attr-defined]
        if received is not None:
            received.append(signum)
        logging.getLogger("zmqrl").info("%s: stopping cleanly", signal.Signals(signum).name)
        request_stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


def _run_role(make: Callable[[], Any], received: list[int] | None = None) -> dict[str, Any]:
    """Build and run a role. Settings that cannot work (the ConfigError family, whether found while
    building or deep inside ``run()``) exit 2 with one line; a port in use or unusable keys exit 1
    with one line, as does an actor that could not reach its learner; anything else is a bug and
    propagates: a traceback in the log, exit 1. Stop signals go to ``received`` (see above)."""
    from zmqrl.envs import EnvError
    from zmqrl.errors import ConfigError
    from zmqrl.memory import ReplayMemoryError
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
    supervisor hears it within a second of its start), the guard that turns any thread's death
    into the process's, and the parent-death signal when a supervisor started it."""
    from zmqrl.guard import install_process_guard
    from zmqrl.supervision.link import SupervisorLink, die_with_parent
    from zmqrl.transport.keys import SecurityError

    install_process_guard()
    die_with_parent()
    import zmq

    try:
        return SupervisorLink(zmq.Context.instance(), cfg, role, role_id)
    except SecurityError as exc:
        _fail(" ".join(str(exc).split()), EXIT_RUNTIME)


def main() -> None:
    app()


# The commands register themselves on ``app`` when imported, in this order in `zmqrl --help`:
# launch, supervise (cli_launch), then learner, actor, evaluator, health, eval, keys, config.
from zmqrl import cli_launch, cli_roles  # noqa: F401

if __name__ == "__main__":
    main()
