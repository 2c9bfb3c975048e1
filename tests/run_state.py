"""A run's state as tests read it: the supervisor's status snapshot, a role's health file, the files
a run leaves (stats, checkpoints), never its log lines.

Log lines are for people and may be reworded; what a test waits for or checks (a process up, a
restart counted, the endpoints a learner bound, what it resumed from) is read where the product
keeps it as data:

- a launched run: ``RUN_DIR/supervisor.json`` says where its supervisor answers; the answer is the
  same :class:`RunSnapshot` ``zmqrl status --json`` prints (a row per process: pid, state,
  restarts, weights version);
- a role started by hand: the health file its heartbeat thread rewrites (``ZMQRL_HEALTH_FILE``):
  state, progress, and ``info`` (the learner's bound endpoints);
- after the run: ``stats.json`` (the supervisor's summary), ``learner-stats.json``, checkpoints.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from zmqrl.runtime.health import HEALTH_FILE_ENV, HealthRecord, read_health
from zmqrl.supervisor.snapshot import ProcessRow, RunSnapshot
from zmqrl.supervisor.status import StatusError, StatusRecord, fetch_status
from zmqrl.transport.keys import Security

# Heartbeat states of a role whose main loop runs (past start-up): "starting" is the state its
# heartbeat thread reports before the first round of the main loop.
WORKING = ("running", "waiting", "blocked", "evaluating")
# Seconds between two questions to a supervisor (each one costs its loop a snapshot).
POLL_SECONDS = 0.1


# ---------------------------------------------------------------------- a launched run: its supervisor
def snapshot(run_dir: Path, timeout: float = 1.0) -> RunSnapshot | None:
    """The run's status snapshot, as ``zmqrl status RUN_DIR --json`` gets it; None while no
    supervisor answers (not started yet, or gone)."""
    try:
        record = StatusRecord.read(run_dir)
    except StatusError:
        return None  # being written
    if record is None or record.state != "running":
        return None
    security = Security.load(Path(record.keys_dir), client=record.key_name) if record.keys_dir else None
    try:
        return fetch_status(record.endpoint, timeout, security=security)
    except StatusError:
        return None


def wait_for_snapshot(
    run_dir: Path,
    ok: Callable[[RunSnapshot], bool],
    timeout: float,
    what: str,
    alive: Callable[[], bool] | None = None,
) -> RunSnapshot:
    """Poll the run's snapshot until ``ok``; returns it. ``alive`` (say, the launch still running)
    ends the wait at once when it turns false."""
    deadline = time.monotonic() + timeout
    last: RunSnapshot | None = None
    while True:
        last = snapshot(run_dir) or last
        if last is not None and ok(last):
            return last
        if alive is not None and not alive():
            raise AssertionError(f"the run ended before {what}; last snapshot: {last}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last snapshot: {last}")
        time.sleep(POLL_SECONDS)


def process(run_dir: Path, name: str) -> ProcessRow | None:
    """Row ``name`` ("learner-0", "actor-1") of the run's snapshot; None without an answer."""
    snap = snapshot(run_dir)
    return row_of(snap, name) if snap is not None else None


def is_up(row: ProcessRow | None) -> bool:
    """Heard from, and past its start-up: its main loop has come round."""
    return row is not None and row.pid is not None and row.state in WORKING


def wait_for_process_row(
    run_dir: Path,
    name: str,
    ok: Callable[[ProcessRow], bool],
    timeout: float,
    what: str,
    alive: Callable[[], bool] | None = None,
) -> ProcessRow:
    """Poll the run's snapshot until row ``name`` satisfies ``ok``; returns that row. ``alive``
    (say, the launch still running) ends the wait at once when it turns false."""
    deadline = time.monotonic() + timeout
    last: ProcessRow | None = None
    while True:
        last = process(run_dir, name) or last
        if last is not None and ok(last):
            return last
        if alive is not None and not alive():
            raise AssertionError(f"the run ended before {name} {what}; last seen: {last}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {name} {what}; last seen: {last}")
        time.sleep(POLL_SECONDS)


def wait_until_up(
    run_dir: Path,
    name: str,
    timeout: float,
    *,
    restarts: int = 0,
    alive: Callable[[], bool] | None = None,
) -> ProcessRow:
    """Wait for process ``name`` to be past its start-up, in its incarnation after ``restarts``
    restarts of its slot (0: the first); returns its row (its pid is that process's)."""
    return wait_for_process_row(
        run_dir,
        name,
        lambda row: row.restarts >= restarts and is_up(row),
        timeout,
        f"up (after {restarts} restart(s))",
        alive,
    )


def row_of(snap: RunSnapshot, name: str) -> ProcessRow | None:
    """Row ``name`` ("learner-0", "actor-1") of ``snap``."""
    return next((row for row in snap.processes if row.name == name), None)


def beat_heard_at(snap: RunSnapshot, row: ProcessRow) -> float | None:
    """When the supervisor heard ``row``'s latest heartbeat, in seconds after the launch (the
    clock of ``snap.elapsed``); None before its first."""
    return None if row.heartbeat_age is None else snap.elapsed - row.heartbeat_age


# Two snapshots showing the same heartbeat can put it this far apart: the supervisor reads its two
# clocks (the heartbeat's age, the elapsed time) a moment apart while it builds a snapshot. Two
# heartbeats are a heartbeat interval apart (0.2 s in tiny_overrides, 0.5 s by default).
SAME_BEAT_SECONDS = 0.1


class WorkHeard:
    """Tells, from a run's successive snapshots, when its supervisor counts a process as having
    done useful work, the fact its restart policy turns on (zmqrl/supervisor/restarts.py: a process
    killed from outside after useful work is restarted at the base delay, and the death does not
    count towards ``supervisor.max_restarts``).

    The supervisor marks a process useful at the first heartbeat whose ``work`` counter moved
    (zmqrl/supervisor/liveness.py). A snapshot shows that work as the process's rate (env steps/s,
    updates/s) above 0; the rate can show a round's env steps one heartbeat before the tick that
    counts the round as work, so a process counts as heard working once a later heartbeat of the
    same process has been heard too."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[int | None, float]] = {}  # name -> (pid, its first beat at work)

    def __call__(self, snap: RunSnapshot, name: str, restarts: int = 0) -> bool:
        """Whether ``snap`` shows process ``name`` (its incarnation after ``restarts`` restarts of
        its slot) heard working; call it with each new snapshot."""
        row = row_of(snap, name)
        if row is None or row.restarts < restarts or not is_up(row):
            return False
        heard = beat_heard_at(snap, row)
        if heard is None:
            return False
        first = self._first.get(name)
        if first is None or first[0] != row.pid:  # not seen working yet, or another process now
            if row.rate > 0:
                self._first[name] = (row.pid, heard)
            return False
        return heard > first[1] + SAME_BEAT_SECONDS


def wait_until_working(
    run_dir: Path,
    name: str,
    timeout: float,
    *,
    restarts: int = 0,
    alive: Callable[[], bool] | None = None,
) -> ProcessRow:
    """Wait until the supervisor counts process ``name`` (its incarnation after ``restarts``
    restarts of its slot) as having done useful work (:class:`WorkHeard`); returns its row."""
    heard = WorkHeard()
    snap = wait_for_snapshot(
        run_dir,
        lambda s: heard(s, name, restarts),
        timeout,
        f"{name} to be heard working (after {restarts} restart(s))",
        alive,
    )
    row = row_of(snap, name)
    assert row is not None
    return row


# ---------------------------------------------------------------------- a role started by hand
def with_health_file(path: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """An environment for a role process that writes its health file to ``path``."""
    return {**(environ if environ is not None else os.environ), HEALTH_FILE_ENV: str(path)}


def health(path: Path) -> HealthRecord | None:
    """The role's latest health record; None before its first beat."""
    try:
        return read_health(path)
    except ValueError:
        return None


def wait_for_health(
    path: Path,
    ok: Callable[[HealthRecord], bool],
    timeout: float,
    what: str,
    proc: subprocess.Popen[Any] | None = None,
) -> HealthRecord:
    """Poll the health file until ``ok``; fails at once when ``proc`` (the role) has exited."""
    deadline = time.monotonic() + timeout
    while True:
        record = health(path)
        if record is not None and ok(record):
            return record
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the role exited ({proc.returncode}) before {what}; last record: {record}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last record: {record}")
        time.sleep(POLL_SECONDS / 2)


def wait_for_endpoints(
    path: Path, timeout: float, proc: subprocess.Popen[Any] | None = None
) -> dict[str, str]:
    """The endpoints a learner started by hand really bound (port 0 resolved), from its health
    file: {"samples": ..., "weights": ...}."""
    record = wait_for_health(
        path, lambda r: "samples" in r.info and "weights" in r.info, timeout, "the learner's endpoints", proc
    )
    return {"samples": record.info["samples"], "weights": record.info["weights"]}


def wait_until_role_up(path: Path, timeout: float, proc: subprocess.Popen[Any] | None = None) -> HealthRecord:
    """A role started by hand is past its start-up: its main loop has come round."""
    return wait_for_health(path, lambda r: r.state in WORKING, timeout, "the role's main loop", proc)


def launched_endpoints(run_dir: Path) -> dict[str, str] | None:
    """The learner's real endpoints in a launched run: with port 0 asked for, the supervisor
    rewrites ``RUN_DIR/config.yaml`` with them (what its actors read) once the learner has bound;
    None before that."""
    try:
        transport = yaml.safe_load((run_dir / "config.yaml").read_text())["transport"]
    except (FileNotFoundError, TypeError, KeyError, yaml.YAMLError):
        return None  # not written yet, or being written
    found = {key: str(transport[key]) for key in ("samples", "weights")}
    if any(ep.rsplit(":", 1)[-1] in ("0", "*") for ep in found.values()):
        return None
    return found


def wait_for_launched_endpoints(
    run_dir: Path, timeout: float, proc: subprocess.Popen[Any] | None = None
) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while (found := launched_endpoints(run_dir)) is None:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the launch exited ({proc.returncode}) before its learner bound")
        if time.monotonic() > deadline:
            raise AssertionError(f"no learner endpoints in {run_dir / 'config.yaml'} within {timeout} s")
        time.sleep(POLL_SECONDS)
    return found


# ---------------------------------------------------------------------- files a run leaves
def run_stats(run_dir: Path) -> dict[str, Any]:
    """``stats.json``: the supervisor's summary (or serial mode's)."""
    data: dict[str, Any] = json.loads((run_dir / "stats.json").read_text())
    return data


def learner_stats(run_dir: Path) -> dict[str, Any]:
    """``learner-stats.json``: the learner's final stats (state, counters, ``resumed_from``)."""
    data: dict[str, Any] = json.loads((run_dir / "learner-stats.json").read_text())
    return data


def checkpointed_updates(run_dir: Path) -> int:
    """The update count of the newest periodic checkpoint on disk (0: none yet)."""
    names = [p.name for p in (run_dir / "checkpoints").glob("ckpt-*")]
    return max((int(n.split("-")[1]) for n in names if n.split("-")[1].isdigit()), default=0)


def published_version(run_dir: Path) -> int:
    """The highest weights version the run's learner has published (``weights-version``; 0: none)."""
    try:
        return int((run_dir / "weights-version").read_text().split()[0])
    except (FileNotFoundError, IndexError, ValueError):
        return 0


def noticed(row: ProcessRow) -> bool:
    """The supervisor has judged the slot's process gone (down, a restart due, or done)."""
    return row.restarts >= 1 or row.state in ("down", "given up") or row.state.startswith("restarting")


def metric_steps(run_dir: Path, source: str, tag: str) -> list[int]:
    """The steps at which ``source`` ("learner", "actor-0") reported ``tag`` in ``metrics.jsonl``
    (a partly written last line is skipped)."""
    try:
        text = (run_dir / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return []
    steps = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("source") == source and row.get("tag") == tag:
            steps.append(int(row["step"]))
    return steps
