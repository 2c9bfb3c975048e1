"""One run of a trial: ``zmqrl launch`` (or ``--serial``) as a child process, followed live.

Why a child process and not :func:`zmqrl.train` in the tuner: a trial is then exactly the run
``zmqrl launch`` makes (the best config written at the end reproduces it), a crash or a leak in
one trial cannot take the study down, and stopping a pruned trial is the same SIGTERM a user's
``kill`` sends: the supervisor stops its learner and actors, writes its summary, exits 143.

The evaluations come from the run's ``metrics.jsonl`` (``charts/eval_return``, written by the
learner or the evaluator as each evaluation ends), read as it grows while waiting on the child.

No process outlives the tuner: the child gets SIGTERM from the kernel when the tuner dies, even
by SIGKILL (``PR_SET_PDEATHSIG``), and stops its own children as on any SIGTERM. A child that does
not stop within ``STOP_SECONDS`` is killed with its whole process group. The death signal is set by
a few lines of Python the child runs before it execs ``zmqrl launch`` (:data:`DEATH_SIGNAL`), not
by a ``preexec_fn``: that runs between fork and exec in a copy of the tuner, and with the tuner's
other threads (Optuna's heartbeat) holding locks at the fork it can deadlock.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO

from zmqrl.tune.objective import EvalPoint

EVAL_TAG = "charts/eval_return"
# How often the tuner looks for new evaluations while waiting on the run.
POLL_SECONDS = 0.2
# How long a stopped run gets to write its final checkpoint and summary before it is killed; the
# supervisor's own stop_grace for its children is shorter.
STOP_SECONDS = 60.0
# argv: the tuner's pid, then the command. The death signal survives execve (python is not
# set-user-ID); a tuner that died before prctl took effect is caught by the getppid check.
DEATH_SIGNAL = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    os._exit(143)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


# Each trial binds ports the OS chooses, on loopback: two tuners on one host (a shared study) run
# trials at the same time, and a config's fixed ports (5555..5558, 9464) would collide. A trial is
# always a local `zmqrl launch`; a --set of any of these (the command line's or the space's) wins.
OWN_PORTS = [
    "transport.samples=tcp://127.0.0.1:0",
    "transport.weights=tcp://127.0.0.1:0",
    "transport.heartbeat=tcp://127.0.0.1:0",
    "transport.control=tcp://127.0.0.1:0",
    "supervisor.metrics_http=127.0.0.1:0",
]


@dataclass(frozen=True)
class RunSpec:
    """What to launch: the config, every ``--set`` (the run's own directory among them)."""

    config: Path
    overrides: list[str]
    run_dir: Path
    log_path: Path  # the child's stdout and stderr
    serial: bool = False

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "zmqrl", "launch", str(self.config)]
        if self.serial:
            cmd.append("--serial")
        for item in [
            *OWN_PORTS,
            *self.overrides,
            f"run.dir={self.run_dir.parent}",
            f"run.name={self.run_dir.name}",
        ]:
            cmd += ["--set", item]
        return cmd


@dataclass
class Outcome:
    """How a run ended: its exit code, whether the tuner stopped it (pruned), its evaluations."""

    code: int
    pruned: bool
    seconds: float
    points: list[EvalPoint] = field(default_factory=list)


class MetricsTail:
    """The evaluations appended to a ``metrics.jsonl`` since the last read (complete lines only)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def new_points(self) -> list[EvalPoint]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        points = []
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:
                continue
            if isinstance(row, dict) and row.get("tag") == EVAL_TAG:
                points.append(EvalPoint(float(row["time"]), int(row["step"]), float(row["value"])))
        return points


class TrialRun:
    """A launched run; use as a context manager so it is stopped and reaped whatever happens."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None
        self._started = 0.0

    def __enter__(self) -> TrialRun:
        if self.spec.run_dir.exists():
            # launch would move the run to NAME-2 and this tuner would follow the wrong file.
            raise FileExistsError(f"{self.spec.run_dir} already exists: a tune dir holds one study's trials")
        self.spec.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = self.spec.log_path.open("ab")
        self._started = time.monotonic()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", DEATH_SIGNAL, str(os.getpid()), *self.spec.command()],
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            start_new_session=True,  # a terminal's Ctrl-C reaches the tuner, which stops it once
        )
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.stop()
        if self._log is not None:
            self._log.close()

    def follow(self, on_eval: Callable[[list[EvalPoint]], bool]) -> Outcome:
        """Wait for the run to end, calling ``on_eval`` with all evaluations so far after each new
        one; when it returns True (prune), stop the run and return at once."""
        assert self.proc is not None
        tail = MetricsTail(self.spec.run_dir / "metrics.jsonl")
        points: list[EvalPoint] = []
        while True:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=POLL_SECONDS)
            for point in tail.new_points():
                points.append(point)
                if self.proc.returncode is None and on_eval(points):
                    return Outcome(self.stop(), True, self._elapsed(), points)
            if self.proc.returncode is not None:
                return Outcome(self.proc.returncode, False, self._elapsed(), points)

    def stop(self) -> int:
        """SIGTERM, as a user would send it; the whole process group is killed only if the run does
        not end within STOP_SECONDS. Returns the exit code."""
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait()

    def _elapsed(self) -> float:
        return time.monotonic() - self._started
