"""The health file (zmqrl/runtime/health.py) as its readers judge it when the wall clock is stepped,
and as its writer creates it in a directory others can write to.

A step of the wall clock (NTP at a container's start) must neither kill a healthy role nor hide a
dead one: beats carry their moments on the monotonic clock every process of a boot shares, and
``zmqrl health`` and the container's init measure ages on it. A file an older zmqrl wrote (format 1:
wall times only), or one from another boot, is still judged, by its wall times."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import zmq

from tests.conftest import tiny_config, wait_until
from zmqrl.cli.container_init import stale_verdict
from zmqrl.cli.healthcheck import verdict
from zmqrl.runtime.health import HEALTH_FORMAT, HealthRecord, health_clock, judge, read_health, write_health
from zmqrl.runtime.link import SupervisorLink

HOUR = 3600.0


def beat(path: Path, *, wall_offset: float = 0.0, clock_age: float = 0.0, pid: int = 42) -> HealthRecord:
    """Writes the beat a role writes now, whose wall clock reads ``wall_offset`` s off and whose last
    beat and progress were ``clock_age`` s ago on the monotonic clock."""
    wall, clock = time.time() + wall_offset - clock_age, health_clock() - clock_age
    record = HealthRecord(
        "actor", 1, pid, "running", wall, 5, wall, 3.0, 60.0, clock=clock, progress_clock=clock
    )
    write_health(path, record)
    return record


def test_a_wall_clock_stepped_forward_does_not_make_a_healthy_role_dead(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    beat(path)
    ok, reason = judge(read_health(path), now=time.time() + HOUR)  # NTP stepped the clock an hour on
    assert ok, reason
    assert stale_verdict(path, 42, now=time.time() + HOUR) is None


def test_a_wall_clock_stepped_back_does_not_hide_a_dead_role(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    beat(path, wall_offset=HOUR, clock_age=10.0)  # its wall stamps look fresh to a clock set back
    ok, reason = judge(read_health(path), now=time.time() + HOUR)
    assert not ok and "no heartbeat for 10." in reason
    assert stale_verdict(path, 42) is not None  # 10 s > 2 x heartbeat_timeout


def test_progress_is_measured_on_the_same_clock(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    clock = health_clock()
    wall = time.time()
    record = HealthRecord(
        "learner", 0, 7, "running", wall, 5, wall, 3.0, 60.0, clock=clock, progress_clock=clock - 90
    )
    write_health(path, record)
    ok, reason = judge(read_health(path), now=wall - HOUR)
    assert not ok and "no progress for 90." in reason


def test_the_file_says_its_format_and_keeps_the_wall_times_for_people(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    written = beat(path)
    data = json.loads(path.read_text())
    assert data["format"] == HEALTH_FORMAT == 2
    assert (data["time"], data["clock"], data["boot"]) == (written.time, written.clock, written.boot)
    assert read_health(path) == written


def format_1(path: Path, age: float) -> None:
    """What zmqrl wrote before format 2: wall times only, no "format" key."""
    now = time.time() - age
    old = {"role": "actor", "id": 3, "pid": 42, "state": "running", "time": now, "progress": 10}
    limits = {"progress_time": now, "heartbeat_timeout": 3.0, "progress_timeout": 60.0}
    path.write_text(json.dumps({**old, **limits, "info": {"host": "h"}}))


@pytest.mark.parametrize(("age", "healthy"), [(0.0, True), (10.0, False)])
def test_a_format_1_file_is_still_judged_by_its_wall_times(tmp_path: Path, age: float, healthy: bool) -> None:
    path = tmp_path / "health.json"
    format_1(path, age)
    record = read_health(path)
    assert record.progress_clock is None
    assert judge(record)[0] == healthy
    assert (verdict(path)[0] == 0) == healthy
    assert (stale_verdict(path, 42) is None) == healthy


def test_a_file_from_another_boot_is_judged_by_its_wall_times(tmp_path: Path) -> None:
    """A file on a volume that outlived a reboot: its monotonic moments belong to the old boot."""
    path = tmp_path / "health.json"
    beat(path, wall_offset=-HOUR)  # fresh on this boot's monotonic clock, an hour old on the wall
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "boot": "an-earlier-boot"}))
    ok, reason = judge(read_health(path))
    assert not ok and "no heartbeat for 3600" in reason


@pytest.mark.parametrize(("key", "value"), [("clock", "soon"), ("progress_clock", True), ("boot", 7)])
def test_a_malformed_format_2_field_is_unreadable_not_a_crash(
    tmp_path: Path, key: str, value: object
) -> None:
    path = tmp_path / "health.json"
    beat(path)
    path.write_text(json.dumps({**json.loads(path.read_text()), key: value}))
    with pytest.raises(ValueError, match=f"unreadable health file .*{key}"):
        read_health(path)


def test_the_init_leaves_a_role_alone_whose_wall_clock_jumped(tmp_path: Path) -> None:
    """The container's init, on a role whose every beat reads the wall clock an hour off (as after
    a step between its beats and the init's checks): before, it saw no beat for an hour and killed
    the role with exit 3; now the role runs until it finishes and the container exits 0."""
    health = tmp_path / "health.json"
    role = tmp_path / "role.py"
    role.write_text(
        textwrap.dedent(
            """
            import os, time
            from pathlib import Path
            from zmqrl.runtime.health import HealthRecord, health_clock, write_health
            path = Path(os.environ["ZMQRL_HEALTH_FILE"])
            def beat(state):
                wall, clock = time.time() - 3600, health_clock()
                record = HealthRecord("actor", 7, os.getpid(), state, wall, 1, wall, 0.3, 60.0)
                record.clock = record.progress_clock = clock
                write_health(path, record)
            until = time.monotonic() + 1.6  # past an init check (every 1 s; 2 x 0.3 s allowed)
            while time.monotonic() < until:
                beat("running")
                time.sleep(0.05)
            beat("finished")
            """
        )
    )
    env = {**os.environ, "ZMQRL_HEALTH_FILE": str(health)}
    cmd = [sys.executable, "-m", "zmqrl.cli.container_init", sys.executable, str(role)]
    done = subprocess.run(cmd, env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert b"has not beaten" not in done.stderr


def test_a_roles_link_writes_format_2_beats_that_a_wall_step_does_not_fail(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    """The real writer (zmqrl/runtime/link.py's heartbeat thread) keeps its progress moment on the
    monotonic clock too, so `zmqrl health` stays healthy across a step of the wall clock."""
    heartbeats, control = ctx.socket(zmq.PULL), ctx.socket(zmq.PUB)
    try:
        endpoints = {}
        for name, sock in (("heartbeat", heartbeats), ("control", control)):
            sock.bind("tcp://127.0.0.1:0")
            endpoints[f"transport__{name}"] = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        cfg = tiny_config(tmp_path, supervisor__heartbeat_interval=0.05, **endpoints)
        path = tmp_path / "health.json"
        link = SupervisorLink(ctx, cfg, "learner", 0, watch_supervisor=False, health_file=path)
        try:
            link.tick(lambda: {"updates": 1})
            wait_until(
                lambda: path.is_file() and read_health(path).progress == 1, 10, "a beat after the tick"
            )
        finally:
            link.close()
    finally:
        heartbeats.close(linger=0)
        control.close(linger=0)
    record = read_health(path)
    assert json.loads(path.read_text())["format"] == 2 and record.progress_clock is not None
    ok, reason = judge(record, now=time.time() + HOUR)
    assert ok, reason


# ---------------------------------------------------------------------- the writer's temporary file


def test_a_link_planted_at_a_temporary_name_is_never_followed(tmp_path: Path) -> None:
    """Before, the temporary name was `.NAME.PID.tmp`: anyone who could write the directory (/tmp)
    could put a symlink there and have the role overwrite the file it pointed at."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "health.json"
    for pid in {os.getpid(), os.getppid()}:
        (tmp_path / f".{path.name}.{pid}.tmp").symlink_to(victim)
    written = beat(path)
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and read_health(path) == written


def test_a_link_at_the_health_files_name_is_replaced_not_written_through(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious")
    path = tmp_path / "health.json"
    path.symlink_to(victim)
    beat(path)
    assert victim.read_text() == "precious" and not path.is_symlink()


def test_writes_leave_no_temporary_files_and_respect_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "health.json"
    for _ in range(5):
        beat(path)
    assert [p.name for p in tmp_path.iterdir()] == ["health.json"]
    assert path.stat().st_mode & 0o777 == 0o644 & ~current_umask()


def test_a_directory_it_cannot_write_does_not_take_the_role_down(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    beat(blocked / "health.json")  # NotADirectoryError, swallowed: the stale file is the truth


def current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
