"""The real roles a fan-in measurement runs against: a watch-only supervisor (``zmqrl supervise``)
and a learner (``zmqrl learner``), each started by its command line on loopback ports asked from
the OS, with the control plane authenticated as in a deployment (the supervisor holds the run's
token and writes one key per role; the learner and the simulated actors read their own).

The learner is a black box here: it is read only through its process (CPU time from /proc, its
threads and any processes it starts), the supervisor's status answers (its counters, as of its
latest heartbeat) and files in its run directory, so the measurement holds whatever the learner
does inside (an ingest thread or an ingest process).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TypeVar

from zmqrl.config import LearnerConfig
from zmqrl.runtime.health import HEALTH_FILE_ENV
from zmqrl.supervisor.snapshot import RunSnapshot
from zmqrl.supervisor.status import StatusClient, StatusError, StatusRecord
from zmqrl.transport.control_keys import CONTROL_TOKEN_ENV
from zmqrl_bench.cpu import STIME_AFTER_NAME, TICKS_PER_S, UTIME_AFTER_NAME, process_cpu_seconds

# The endpoints a run binds: the learner's two, the supervisor's two.
ENDPOINTS = ("samples", "weights", "heartbeat", "control")
# How long a role may take to start (a torch import on a busy 2-core machine) or to stop.
START_TIMEOUT = 120.0
STOP_TIMEOUT = 30.0
# Lines of a role's log quoted when it fails.
LOG_TAIL_LINES = 30
# A thread of ZeroMQ's (its I/O threads name themselves so): what the learner spends on sockets.
ZMQ_THREAD_PREFIX = "ZMQbg/"
# The environment a role must not inherit from whoever runs the bench: another run's secret or
# health file would be read instead of this run's.
FOREIGN_ENV = (CONTROL_TOKEN_ENV, HEALTH_FILE_ENV)
T = TypeVar("T")

# What tells a role started by hand to wait for its supervisor and leave when it is gone.
SUPERVISED_ENV = "ZMQRL_SUPERVISED"


def free_ports(count: int) -> list[int]:
    """``count`` ports the OS says are free on 127.0.0.1 now (held together while asked, so they
    differ; another process could take one before the roles bind it, as in every such test)."""
    held = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def loopback_endpoints() -> dict[str, str]:
    """The four endpoints of one run, on free loopback ports."""
    ports = free_ports(len(ENDPOINTS))
    return {name: f"tcp://127.0.0.1:{port}" for name, port in zip(ENDPOINTS, ports, strict=True)}


def learner_overrides(actors: int) -> list[str]:
    """The learner as a throughput test wants it: no replay ratio and (where the setting exists) no
    ingest budget, so what is offered is what arrives; no evaluations or checkpoints during the run
    (one greedy episode at its end); the default queues; ``actors`` expected (sequence tracking)."""
    values: dict[str, object] = {
        "actor.num_actors": actors,
        "learner.samples_per_insert": "null",
        "learner.max_updates": 10**9,
        "learner.eval_interval": 0,
        "learner.eval_episodes": 1,
        "learner.checkpoint_interval": 0,
        "learner.target_return": "null",
        "learner.stop_at_target": "false",
        "checkpoint.replay": "false",
        "transport.samples_hwm": 64,
        "transport.samples_buffer_kb": 0,
        "supervisor.metrics_http": "null",
    }
    if "ingest_max_share" in {f.name for f in dataclasses.fields(LearnerConfig)}:
        values["learner.ingest_max_share"] = "null"
    return [f"{key}={value}" for key, value in values.items()]


@dataclasses.dataclass(frozen=True)
class RunPaths:
    """Where one measured run lives, and its secrets beside it."""

    root: Path
    name: str

    @property
    def run_dir(self) -> Path:
        return self.root / self.name

    @property
    def token_file(self) -> Path:
        return self.root / f"{self.name}-secrets" / "control.token"

    @property
    def keys_dir(self) -> Path:
        return self.root / f"{self.name}-secrets" / "control-keys"


class Role:
    """One zmqrl command, started as a child of this process, its output in a log file."""

    def __init__(
        self, args: list[str], config: Path, overrides: list[str], log: Path, supervised: bool
    ) -> None:
        cmd = [sys.executable, "-m", "zmqrl", *args, str(config)]
        for item in overrides:
            cmd += ["--set", item]
        env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV and k != SUPERVISED_ENV}
        env["PYTHONUNBUFFERED"] = "1"
        if supervised:
            env[SUPERVISED_ENV] = "1"
        self.name = args[0]
        self.log = log
        self._out: IO[bytes] = log.open("wb")
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self) -> str:
        try:
            lines = self.log.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-LOG_TAIL_LINES:])

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise RuntimeError(
                f"zmqrl {self.name} exited with {self.proc.returncode} during the fan-in bench:\n"
                + self.tail()
            )

    def end(self, sig: int = signal.SIGTERM) -> None:
        """Ask it to stop (``sig``), then kill it if it has not after STOP_TIMEOUT."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._out.close()


class Roles:
    """A supervisor, then a learner, for one measured run; ``close()`` ends both (SIGTERM to the
    supervisor, which stops the learner as in any run; whatever is left is killed)."""

    def __init__(
        self, config: Path, paths: RunPaths, endpoints: dict[str, str], overrides: list[str]
    ) -> None:
        self.paths = paths
        self.endpoints = endpoints
        paths.run_dir.parent.mkdir(parents=True, exist_ok=True)
        common = [
            f"run.dir={paths.root}",
            f"run.name={paths.name}",
            *overrides,
            *(f"transport.{name}={endpoint}" for name, endpoint in endpoints.items()),
            f"transport.control_keys_dir={paths.keys_dir}",
        ]
        logs = paths.root / f"{paths.name}-logs"
        logs.mkdir(parents=True, exist_ok=True)
        self._config, self._common, self._logs = config, common, logs
        self.supervisor: Role | None = None
        self.learner: Role | None = None
        self.client: StatusClient | None = None

    def start(self) -> None:
        """The supervisor, until it answers status requests; then the learner, until the
        supervisor has heard from it."""
        self.supervisor = Role(
            ["supervise", "--plain"],
            self._config,
            [*self._common, f"transport.control_token_file={self.paths.token_file}"],
            self._logs / "supervisor.log",
            supervised=False,
        )
        record = self._wait(lambda: StatusRecord.read(self.paths.run_dir), "the supervisor's status record")
        self.client = StatusClient(record.endpoint)
        self._wait(self.status, "the supervisor to answer")
        self.learner = Role(
            ["learner"], self._config, self._common, self._logs / "learner.log", supervised=True
        )
        self._wait(lambda: self._learner_row(self.status()), "the learner's first heartbeat")

    def _learner_row(self, snap: RunSnapshot | None) -> bool:
        return snap is not None and any(
            r.role == "learner" and r.pid == self.learner_pid for r in snap.processes
        )

    @property
    def learner_pid(self) -> int | None:
        return self.learner.pid if self.learner is not None else None

    def _wait(self, ready: Callable[[], T | None], what: str) -> T:
        """``ready()``'s first true value, the roles checked alive meanwhile."""
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            for role in (self.supervisor, self.learner):
                if role is not None:
                    role.check_alive()
            try:
                value = ready()
            except StatusError:
                value = None
            if value:
                return value
            time.sleep(0.1)
        raise RuntimeError(f"timed out after {START_TIMEOUT:g} s waiting for {what}")

    def status(self) -> RunSnapshot | None:
        """The supervisor's snapshot now (None: no answer within a second)."""
        assert self.client is not None
        try:
            return self.client.fetch(1.0)
        except StatusError:
            return None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        for role in (self.supervisor, self.learner):  # the supervisor's stop reaches the learner
            if role is not None:
                role.end()


def _stat_fields(path: Path) -> list[str] | None:
    """The fields of a /proc stat file after the command name (which may hold spaces)."""
    try:
        return path.read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(pid: int) -> list[int]:
    """Every live process started by ``pid`` or by one of its descendants (from /proc's parent
    ids; none where there is no /proc)."""
    parents: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                fields = _stat_fields(entry / "stat")
                if fields is not None and len(fields) > 1:
                    parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        children = parents.get(todo.pop(), [])
        found += children
        todo += children
    return found


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU seconds of ``pid`` and every process it started that is still running (a learner's
    ingest or replay process counts as the learner's own); None when ``pid`` cannot be read."""
    own = process_cpu_seconds(pid)
    if own is None:
        return None
    return own + sum(process_cpu_seconds(child) or 0.0 for child in descendants(pid))


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """CPU seconds of ``pid``'s threads in three groups, its main thread, ZeroMQ's I/O threads and
    the others (Python's threads, torch's pool), and of the processes it started ("children": an
    ingest process); empty where /proc cannot tell."""
    groups = {"main": 0.0, "zmq": 0.0, "other": 0.0}
    groups["children"] = sum(process_cpu_seconds(child) or 0.0 for child in descendants(pid))
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return {}
    for task in tasks:
        try:
            text = (task / "stat").read_text()
        except OSError:
            continue
        name = text[text.find("(") + 1 : text.rfind(")")]
        fields = text.rsplit(")", 1)[1].split()
        seconds = (int(fields[UTIME_AFTER_NAME]) + int(fields[STIME_AFTER_NAME])) / TICKS_PER_S
        group = "main" if task.name == str(pid) else "zmq" if name.startswith(ZMQ_THREAD_PREFIX) else "other"
        groups[group] += seconds
    return groups


def machine_busy_seconds() -> float | None:
    """CPU seconds every core of this machine has spent busy since boot (any process, the other
    users' too: /proc/stat's total less idle and I/O wait); None where there is no /proc."""
    try:
        line = Path("/proc/stat").read_text().splitlines()[0]
        ticks = [int(v) for v in line.split()[1:]]
    except (OSError, IndexError, ValueError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)
    return (sum(ticks[:8]) - idle) / TICKS_PER_S
