"""What a command does around the role it runs in this process: its log lines, its stop signals,
the supervisor link it opens first, and the exit code its role's end maps to.

Process mains stay thin (parse config, build the role, run it, clean up, report); this is the part
they share. torch is never imported here: a role's own module brings it when it is built.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from zmqrl.cli.options import EXIT_CONFIG, EXIT_RUNTIME, fail, require_writable

if TYPE_CHECKING:
    from zmqrl.config import Config
    from zmqrl.runtime.link import SupervisorLink

# A role stopped by signal N exits 128 + N (zmqrl/supervisor/restarts.py has the whole table).
SIGNAL_EXIT_BASE = 128
# How often the thread that passes a stop signal on to the role looks for one (seconds).
SIGNAL_POLL_SECONDS = 0.1

# One log record, one line: when (to the millisecond), how bad, which process (the same name as its
# log file, runs/NAME/logs/ROLE-ID.log), which module, what. Tracebacks follow on their own lines.
LOG_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)s {label} %(name)s: %(message)s"
LOG_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class Role(Protocol):
    """What a command runs: the learner, an actor, the evaluator, a serial run."""

    def run(self) -> Mapping[str, Any]: ...

    def request_stop(self) -> None: ...


class _Logging:
    """The one handler ``setup_logging`` installed (replaced when the label changes)."""

    handler: logging.Handler | None = None


def setup_logging(level: str, label: str) -> None:
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


def on_stop_signals(request_stop: Callable[[], None], received: list[int] | None = None) -> None:
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


def role_exit_code(stats: Mapping[str, Any], received: list[int], link: SupervisorLink | None = None) -> int:
    """A role command's exit code: 128 + N when signal N stopped it (a stop nobody in the run
    asked for: a supervisor restarts it), 1 when it ended failed, 4 when its supervisor stayed
    silent past the rejoin grace (so its orchestrator restarts it), else 0 (finished, or stopped
    because the supervisor or the learner asked)."""
    from zmqrl.runtime.exits import EXIT_LOST_SUPERVISOR

    if received:
        return SIGNAL_EXIT_BASE + received[0]
    if stats.get("state") == "failed":
        return EXIT_RUNTIME
    return EXIT_LOST_SUPERVISOR if link is not None and link.lost_supervisor else 0


def check_run_dir(cfg: Config, role: str) -> None:
    """First thing in a role command, before it writes anything: a run directory that cannot be
    made, or whose run finished, is one line and exit 2 (zmqrl/runtime/finished.py says why, and
    who may continue a finished run)."""
    from zmqrl.runtime.finished import RunFinished, refuse_finished_run

    require_writable(cfg.run_dir)
    try:
        refuse_finished_run(cfg.run_dir, role)
    except RunFinished as exc:
        fail(str(exc), EXIT_CONFIG)


def run_role(make: Callable[[], Role], received: list[int] | None = None) -> dict[str, Any]:
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
        on_stop_signals(role.request_stop, received)
        return dict(role.run())
    except (ConfigError, EnvError, ReplayMemoryError) as exc:
        fail(" ".join(str(exc).split()), EXIT_CONFIG)
    except (BindError, SecurityError, LearnerUnreachable) as exc:
        fail(" ".join(str(exc).split()), EXIT_RUNTIME)


def start_link(cfg: Config, role: str, role_id: int) -> SupervisorLink:
    """First thing in a role's process, before torch is imported: its heartbeat thread (so the
    supervisor hears it within a second of its start) with the watchdog that ends a hung process
    (exit 3), the guard that turns any thread's death into the process's, and the parent-death
    signal when a supervisor started it."""
    from zmqrl.runtime.guard import install_process_guard
    from zmqrl.runtime.link import SupervisorLink, die_with_parent
    from zmqrl.transport.keys import SecurityError
    from zmqrl.transport.sockets import BindError

    install_process_guard()
    die_with_parent()
    import zmq

    try:
        return SupervisorLink(zmq.Context.instance(), cfg, role, role_id, watchdog=True)
    except (SecurityError, BindError) as exc:  # BindError: supervisor.health_http's port
        fail(" ".join(str(exc).split()), EXIT_RUNTIME)
