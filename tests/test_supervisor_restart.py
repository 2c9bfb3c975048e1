"""A supervisor started again on a run (issue 37, items 4 and 9): its heartbeat starts before
anything slow, and it carries the run's restart counts on from the record its predecessor kept.

A supervisor that opens W&B or MLflow first was silent for as long as the tracker took (up to
~36 s against one that does not answer), which the roles took for a dead supervisor; and a
supervisor restarted on a run (a SIGKILL and compose's restart, or `docker compose stop` and `up`)
started every restart count at 0. The real runs: tests/test_supervise_rejoin.py and, under
compose, tests/test_compose.py.
"""

from __future__ import annotations

import io
import itertools
import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.conftest import tiny_config
from zmqrl.metrics import NullLogger
from zmqrl.runtime.health import START_INFO_KEY
from zmqrl.supervisor import monitor as monitor_module
from zmqrl.supervisor.status import STATUS_RECORD, StatusRecord
from zmqrl.supervisor.watch import Watcher
from zmqrl.transport import wire
from zmqrl.transport.wire import HeartbeatMsg

HEARTBEAT_TIMEOUT = 0.5
# How long the tracker takes to open in the test: several heartbeat timeouts.
SLOW_OPEN_SECONDS = 2.0


def test_the_supervisors_heartbeat_runs_while_a_tracker_is_slow_to_open(
    tmp_path: Path, ctx: zmq.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    opening = threading.Event()
    answer = threading.Event()

    def slow_tracker(*args: Any, **kwargs: Any) -> NullLogger:  # a tracker that does not answer yet
        opening.set()
        answer.wait(30)
        return NullLogger()

    monkeypatch.setattr(monitor_module, "run_logger", slow_tracker)
    control = f"ipc://{tmp_path}/control"
    cfg = tiny_config(
        tmp_path,
        transport__control=control,
        transport__heartbeat=f"ipc://{tmp_path}/heartbeat",
        supervisor__heartbeat_interval=0.1,
        supervisor__heartbeat_timeout=HEARTBEAT_TIMEOUT,
        supervisor__stop_grace=1.0,
    )
    role = ctx.socket(zmq.SUB)  # what every role's link listens to, connected before the supervisor
    role.setsockopt(zmq.SUBSCRIBE, b"")
    role.connect(control)
    watcher = Watcher(cfg, out=io.StringIO(), dashboard=False, ctx=ctx)
    thread = threading.Thread(target=watcher.run, daemon=True)
    thread.start()
    try:
        assert opening.wait(30), "the supervisor never opened its scalars"
        heard: list[float] = []
        deadline = time.monotonic() + SLOW_OPEN_SECONDS
        while (left := deadline - time.monotonic()) > 0:
            if role.poll(int(left * 1000) + 1):
                msg = wire.load(role.recv_multipart())
                if isinstance(msg, HeartbeatMsg) and msg.role == "supervisor":
                    heard.append(time.monotonic())
        assert not answer.is_set()
        assert len(heard) >= SLOW_OPEN_SECONDS / 0.1 / 2, (
            f"{len(heard)} supervisor heartbeats while its tracker opened for {SLOW_OPEN_SECONDS} s: "
            "every role would have taken it for dead"
        )
        gaps = [b - a for a, b in itertools.pairwise(heard)]
        assert max(gaps, default=0.0) < HEARTBEAT_TIMEOUT
    finally:
        answer.set()
        role.close(linger=0)
        watcher._signal = signal.SIGTERM  # as its handler does: the loop stops the run
        watcher._signals = 1
        thread.join(timeout=30)
    assert not thread.is_alive(), "the supervisor did not stop"


# ---------------------------------------------------------------------------------------------
# Restart counts carried on from the run's record
# ---------------------------------------------------------------------------------------------


def previous_supervisor(run_dir: Path, *, state: str, command: str = "supervise") -> None:
    """The record a supervisor of the run left: it died mid-run ("running") or ended ("finished")."""
    StatusRecord(
        endpoint="tcp://127.0.0.1:1",
        pid=1,
        host="gone",
        command=command,
        started=time.time() - 60,
        state=state,
        slots={
            "learner-0": {"restarts": 1, "start": "learner-start"},
            "actor-0": {"restarts": 2, "start": "actor0-start"},
            "actor-1": {"restarts": 3, "start": "actor1-start"},
        },
    ).write(run_dir)


def heartbeat(role: str, index: int, start: str) -> HeartbeatMsg:
    return HeartbeatMsg(role, index, 1, time.time(), "running", {}, {START_INFO_KEY: start})


def watcher_on(run_dir: Path, tmp_path: Path) -> tuple[Watcher, io.StringIO]:
    cfg = tiny_config(tmp_path, actor__num_actors=2)
    assert cfg.run_dir == run_dir
    out = io.StringIO()
    watcher = Watcher(cfg, out=out, dashboard=False)
    watcher._t0 = 0.0  # what run() sets before the first line
    # The record this supervisor keeps (run() opens it): written again at each join and restart.
    watcher.monitor.record = StatusRecord("tcp://127.0.0.1:2", 2, "here", "supervise", time.time())
    return watcher, out


def recorded_restarts(run_dir: Path) -> dict[str, int]:
    slots = json.loads((run_dir / STATUS_RECORD).read_text())["slots"]
    return {name: mark["restarts"] for name, mark in slots.items()}


def test_a_supervisor_restarted_mid_run_takes_its_roles_back_and_carries_their_restart_counts(
    tmp_path: Path,
) -> None:
    run_dir = tmp_path / "t"
    previous_supervisor(run_dir, state="running")  # SIGKILLed: it never recorded an end
    watcher, out = watcher_on(run_dir, tmp_path)
    now = 10.0
    learner = watcher._slot_for(heartbeat("learner", 0, "learner-start"), now)
    actor0 = watcher._slot_for(heartbeat("actor", 0, "actor0-start"), now)
    assert learner is not None and actor0 is not None
    assert (learner.restarts, actor0.restarts) == (1, 2), "the same processes: taken back, no restart"
    assert "actor-0 rejoined" in out.getvalue()
    # actor-1 was restarted by its orchestrator while no supervisor watched: a new start id.
    actor1 = watcher._slot_for(heartbeat("actor", 1, "actor1-new"), now)
    assert actor1 is not None and actor1.restarts == 4
    assert "actor-1 restarted by its orchestrator while no supervisor watched" in out.getvalue()
    # ... and once more under this supervisor.
    watcher._slot_for(heartbeat("actor", 1, "actor1-newer"), now + 1)
    assert actor1.restarts == 5
    assert recorded_restarts(run_dir) == {"learner-0": 1, "actor-0": 2, "actor-1": 5}


def test_restart_counts_survive_a_stop_and_up(tmp_path: Path) -> None:
    """`docker compose stop` ends the supervisor cleanly (its record says finished) and every role;
    the next `up` starts them all anew: their counts carry on, and none of the new starts counts."""
    run_dir = tmp_path / "t"
    previous_supervisor(run_dir, state="finished")
    watcher, _ = watcher_on(run_dir, tmp_path)
    for role, index in (("learner", 0), ("actor", 0), ("actor", 1)):
        watcher._slot_for(heartbeat(role, index, f"{role}{index}-after-up"), 5.0)
    assert {n: s.restarts for n, s in watcher.slots.items()} == {"learner-0": 1, "actor-0": 2, "actor-1": 3}
    assert recorded_restarts(run_dir) == {"learner-0": 1, "actor-0": 2, "actor-1": 3}


def test_a_slot_not_heard_yet_keeps_its_count_in_the_record(tmp_path: Path) -> None:
    run_dir = tmp_path / "t"
    previous_supervisor(run_dir, state="running")
    watcher, _ = watcher_on(run_dir, tmp_path)
    watcher._slot_for(heartbeat("learner", 0, "learner-start"), 1.0)
    assert recorded_restarts(run_dir) == {"learner-0": 1, "actor-0": 2, "actor-1": 3}


def test_nothing_is_carried_from_a_launch_or_an_unreadable_record(tmp_path: Path) -> None:
    run_dir = tmp_path / "t"
    previous_supervisor(run_dir, state="running", command="launch")  # its roles died with it
    watcher, _ = watcher_on(run_dir, tmp_path)
    slot = watcher._slot_for(heartbeat("actor", 1, "actor1-start"), 1.0)
    assert slot is not None and slot.restarts == 0
    (run_dir / STATUS_RECORD).write_text("{not json")
    watcher, _ = watcher_on(run_dir, tmp_path)
    slot = watcher._slot_for(heartbeat("actor", 1, "actor1-start"), 1.0)
    assert slot is not None and slot.restarts == 0


def test_the_record_keeps_only_well_formed_slot_marks(tmp_path: Path) -> None:
    previous_supervisor(tmp_path, state="running")
    data = json.loads((tmp_path / STATUS_RECORD).read_text())
    data["slots"].update({"actor-5": {"restarts": -1}, "actor-6": "three", "actor-7": {"restarts": True}})
    (tmp_path / STATUS_RECORD).write_text(json.dumps(data))
    record = StatusRecord.read(tmp_path)
    assert record is not None
    assert set(record.slots) == {"learner-0", "actor-0", "actor-1"}
    old = {k: v for k, v in data.items() if k != "slots"}  # a record from before slots were kept
    (tmp_path / STATUS_RECORD).write_text(json.dumps(old))
    record = StatusRecord.read(tmp_path)
    assert record is not None and record.slots == {}
