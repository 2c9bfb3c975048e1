"""Child processes of ``zmqrl launch``: how each role is started, and stopping them all in order.

Each child leads a session (and so a process group) of its own: a terminal's Ctrl-C reaches only
the supervisor, and whatever the child starts (an env's simulator, a vector env's workers) is in
its group. Every kill and stop signal goes to the whole group, and the group is killed once its
leader has exited, so nothing a role started outlives it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from zmqrl.config import without_config_variables
from zmqrl.runtime.health import HEALTH_FILE_ENV
from zmqrl.runtime.launched import LAUNCHED_ENV
from zmqrl.runtime.link import PARENT_PID_ENV, SUPERVISED_ENV
from zmqrl.supervisor.liveness import os_stopped
from zmqrl.supervisor.oversight import STOP_REPEAT_SECONDS

Procs = Mapping[str, "subprocess.Popen[bytes]"]

# Roles whose numpy maths is small matrix products per step (the actors' and the evaluator's
# policies): OpenBLAS splits a product across threads from 262,144 multiply-adds on (4 sub-envs
# through a 256-wide layer), and on a busy machine that hand-off costs far more than the product
# on one thread. One BLAS thread each, unless the user's environment says otherwise.
ONE_BLAS_THREAD_ROLES = ("actor", "evaluator")
BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"
# And on a CPU with AVX-512, OpenBLAS's AVX2 kernels. Its AVX-512 ones (its choice there) made the
# actor's Ape-X priority pass, one (2B, 128) product per batch, slow down the single-row steps
# after it (docs/performance.md, the actor row). The bare loop itself, all one-row products, runs
# as fast with either.
BLAS_CORE_ENV = "OPENBLAS_CORETYPE"
AVX2_CORE = "Haswell"


@functools.cache
def has_avx512(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this CPU has AVX-512 (Linux; elsewhere, or unreadable: False)."""
    try:
        with open(cpuinfo, encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return "avx512f" in line.split()
    except OSError:
        pass
    return False


def small_maths_env() -> dict[str, str]:
    """The environment ONE_BLAS_THREAD_ROLES start with unless the user's sets these variables."""
    return {BLAS_THREADS_ENV: "1", **({BLAS_CORE_ENV: AVX2_CORE} if has_avx512() else {})}


def role_command(role: str, index: int, config_path: Path, *, replacement: bool, resume: bool) -> list[str]:
    """``python -m zmqrl.cli.rolestart ROLE CONFIG``, ``zmqrl ROLE CONFIG`` without typer's start-up
    (that module says why; it understands exactly what this writes): a replacement actor waits for
    current weights; a learner (or evaluator) started again, or in a resumed run, continues from its
    checkpoint."""
    cmd = [sys.executable, "-m", "zmqrl.cli.rolestart", role, str(config_path)]
    if role == "actor":
        cmd += ["--id", str(index)]
        if replacement:
            cmd.append("--replacement")
    elif replacement or resume:
        cmd.append("--resume")
    return cmd


def start_child(cmd: list[str], log_path: Path, launched: float, role: str = "") -> subprocess.Popen[bytes]:
    """Start one role with its output in ``log_path``, in its own session (a terminal's Ctrl-C
    reaches only the supervisor), told who supervises it and when the command began. The config
    file it is given is the whole config: ``ZMQRL_*`` config variables are not passed on, nor
    the supervisor's own health file (``ZMQRL_HEALTH_FILE``: every child would write the same)."""
    inherited = {k: v for k, v in without_config_variables(os.environ).items() if k != HEALTH_FILE_ENV}
    env = {
        **(small_maths_env() if role in ONE_BLAS_THREAD_ROLES else {}),
        **inherited,
        "PYTHONUNBUFFERED": "1",
        SUPERVISED_ENV: "1",
        PARENT_PID_ENV: str(os.getpid()),
        LAUNCHED_ENV: repr(launched),
    }
    with open(log_path, "ab") as logf:
        return subprocess.Popen(
            cmd,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def signal_tree(proc: subprocess.Popen[bytes], signum: int = signal.SIGKILL) -> None:
    """Send ``signum`` to the child's process group (it leads it: its own session). One that has
    exited already is reaped instead, its group's leftovers killed (``reap``)."""
    if reap(proc) is not None:
        return
    # Not reaped: its group id is still its own, whatever else has started since.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signum)


def reap(proc: subprocess.Popen[bytes]) -> int | None:
    """The child's exit code once it has exited, else None. Before it is reaped, what is left of
    its process group (an env's subprocesses) is killed: while the leader is a zombie its group
    id cannot have passed to another process."""
    if proc.returncode is not None:
        return proc.returncode
    waitid = getattr(os, "waitid", None)
    if waitid is not None:
        try:
            if waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT | os.WNOHANG) is None:
                return None
        except ChildProcessError:  # reaped elsewhere
            return proc.poll()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.poll()


def stop_in_order(
    procs: Procs,
    grace: float,
    *,
    broadcast_stop: Callable[[], None],
    pump: Callable[[int], object],
    say: Callable[[str], None],
    clock: Callable[[], float],
) -> None:
    """Stop broadcast (repeated: PUB/SUB may drop the first), then SIGTERM after ``grace``
    seconds, then SIGKILL after another ``grace``; a process stopped by a signal can obey
    neither, so it is killed at once. Signals go to each child's process group. Returns once
    every process has exited (and its group is gone)."""

    def alive() -> list[str]:
        return [name for name, proc in procs.items() if reap(proc) is None]

    started = clock()
    deadline_term, deadline_kill = started + grace, started + 2 * grace
    termed = False
    next_stop = 0.0
    while alive():
        now = clock()
        for name in alive():
            proc = procs[name]
            if os_stopped(proc.pid):
                say(f"warning: {name} (pid {proc.pid}) is stopped by a signal; killing it")
                signal_tree(proc)
        if now >= next_stop:
            broadcast_stop()
            next_stop = now + STOP_REPEAT_SECONDS
        if now >= deadline_kill:
            for name in alive():
                say(f"warning: {name} ignored SIGTERM; killing")
                signal_tree(procs[name])
            break
        if now >= deadline_term and not termed:
            termed = True
            for name in alive():
                say(f"warning: {name} did not stop within {grace:.0f} s; sending SIGTERM")
                signal_tree(procs[name], signal.SIGTERM)
        pump(50)


# How far back in a child's log its last error is looked for (lines).
ERROR_SEARCH_LINES = 400
# The longest error line quoted on the console (characters).
ERROR_LINE_CHARS = 240
# What a line that says what went wrong looks like, in a role's log: a command's one-line
# "error: ..." (exit 2), an exception's last traceback line, an ERROR or CRITICAL log record.
_COMMAND_ERROR = re.compile(r"^error: .+")
_EXCEPTION = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Died|Mismatch|Unreachable|Interrupt|Exit|Fault)"
    r"(?:: .*)?$"
)
_LOG_RECORD = re.compile(r"^\d{4}-\d\d-\d\d [\d:.]+ (?:ERROR|CRITICAL) \S+ \S+: (.+)$")


def last_error_line(path: Path | None) -> str | None:
    """The last line of a child's log that says what went wrong (see above), shortened; None
    when there is none or the log cannot be read."""
    lines = log_tail(path, ERROR_SEARCH_LINES) if path is not None else None
    for line in reversed(lines or []):
        line = line.rstrip()
        record = _LOG_RECORD.match(line)
        found = record.group(1) if record else None
        if found is None and (_COMMAND_ERROR.match(line) or _EXCEPTION.match(line)):
            found = line
        if found:
            return found if len(found) <= ERROR_LINE_CHARS else found[: ERROR_LINE_CHARS - 3] + "..."
    return None


def log_tail(path: Path, lines: int) -> list[str] | None:
    """The last ``lines`` lines of a child's log (None if it cannot be read)."""
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return None
