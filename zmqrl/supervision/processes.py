"""Child processes of ``zmqrl launch``: how each role is started, and stopping them all in order."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from zmqrl.config import without_config_variables
from zmqrl.supervision.link import LAUNCHED_ENV, PARENT_PID_ENV, SUPERVISED_ENV
from zmqrl.supervision.liveness import os_stopped
from zmqrl.supervision.oversight import STOP_REPEAT_SECONDS

Procs = Mapping[str, "subprocess.Popen[bytes]"]

# Roles whose numpy maths is small matrix products per step (the actors' and the evaluator's
# policies): OpenBLAS splits a product across threads from 262,144 multiply-adds on (4 sub-envs
# through a 256-wide layer), and on a busy 2-core machine that hand-off took about 1.6 ms against
# about 60 us on one thread. One BLAS thread each, unless the user's environment says otherwise.
ONE_BLAS_THREAD_ROLES = ("actor", "evaluator")
BLAS_THREADS_ENV = "OPENBLAS_NUM_THREADS"


def role_command(role: str, index: int, config_path: Path, *, replacement: bool, resume: bool) -> list[str]:
    """``python -m zmqrl ROLE CONFIG``: a replacement actor waits for current weights; a learner
    (or evaluator) started again, or in a resumed run, continues from its checkpoint."""
    cmd = [sys.executable, "-m", "zmqrl", role, str(config_path)]
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
    file it is given is the whole config: ``ZMQRL_*`` config variables are not passed on."""
    env = {
        **({BLAS_THREADS_ENV: "1"} if role in ONE_BLAS_THREAD_ROLES else {}),
        **without_config_variables(os.environ),
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
    neither, so it is killed at once. Returns once every process has exited (not yet reaped)."""

    def alive() -> list[str]:
        return [name for name, proc in procs.items() if proc.poll() is None]

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
                proc.kill()
        if now >= next_stop:
            broadcast_stop()
            next_stop = now + STOP_REPEAT_SECONDS
        if now >= deadline_kill:
            for name in alive():
                say(f"warning: {name} ignored SIGTERM; killing")
                procs[name].kill()
            break
        if now >= deadline_term and not termed:
            termed = True
            for name in alive():
                say(f"warning: {name} did not stop within {grace:.0f} s; sending SIGTERM")
                procs[name].terminate()
        pump(50)


def log_tail(path: Path, lines: int) -> list[str] | None:
    """The last ``lines`` lines of a child's log (None if it cannot be read)."""
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return None
