"""Actor ids: --id N > ZMQRL_ACTOR_ID > --id auto > 0; `auto` never hands one id to two live actors."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from zmqrl.actor.ids import ACTOR_ID_ENV, ActorIdClaim, ActorIdError, resolve_actor_id

# A process that claims an id with `auto`, prints it, and holds it until its stdin closes.
CLAIMANT = """
import sys
from pathlib import Path
from zmqrl.actor.ids import resolve_actor_id

claim = resolve_actor_id("auto", {}, Path(sys.argv[1]), int(sys.argv[2]))
print(claim.actor_id, flush=True)
sys.stdin.read()
"""
DEADLINE_S = 60.0


@pytest.fixture
def claims() -> Iterator[list[ActorIdClaim]]:
    """Claims made in this process, released at the end (the test process outlives them)."""
    made: list[ActorIdClaim] = []
    yield made
    for claim in made:
        claim.release()


def claimant(run_dir: Path, num_actors: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLAIMANT, str(run_dir), str(num_actors)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def claimed_id(proc: subprocess.Popen[str]) -> int:
    assert proc.stdout is not None
    line = proc.stdout.readline()  # the claimant prints at once; a crash closes stdout (EOF)
    assert line.strip(), proc.stderr.read() if proc.stderr else "claimant died"
    return int(line)


def finish(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            assert proc.stdin is not None
            proc.stdin.close()  # lets it exit, releasing its id
    for proc in procs:
        try:
            proc.wait(timeout=DEADLINE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# -------------------------------------------------------------------------------------- precedence


def test_nothing_given_keeps_id_0_and_takes_no_lock(tmp_path: Path) -> None:
    claim = resolve_actor_id(None, {}, tmp_path, 4)
    assert (claim.actor_id, claim.source, claim.held) == (0, "default", False)
    assert not (tmp_path / "actor-ids").exists()


def test_an_integer_option_wins_over_the_environment(tmp_path: Path, claims: list[ActorIdClaim]) -> None:
    claims.append(resolve_actor_id("3", {ACTOR_ID_ENV: "5"}, tmp_path, 4))
    assert (claims[-1].actor_id, claims[-1].source) == (3, "--id")


def test_the_environment_wins_over_auto(tmp_path: Path, claims: list[ActorIdClaim]) -> None:
    claims.append(resolve_actor_id("auto", {ACTOR_ID_ENV: "5"}, tmp_path, 4))
    assert (claims[-1].actor_id, claims[-1].source) == (5, ACTOR_ID_ENV)
    claims.append(resolve_actor_id(None, {ACTOR_ID_ENV: "6"}, tmp_path, 4))
    assert claims[-1].actor_id == 6


def test_auto_from_the_option_or_the_environment_claims_the_lowest_free_id(
    tmp_path: Path, claims: list[ActorIdClaim]
) -> None:
    claims.append(resolve_actor_id("auto", {}, tmp_path, 4))
    claims.append(resolve_actor_id(None, {ACTOR_ID_ENV: "AUTO"}, tmp_path, 4))
    assert [c.actor_id for c in claims] == [0, 1]
    assert all(c.source == "auto" and c.held for c in claims)
    assert "pid" in (tmp_path / "actor-ids" / "0.lock").read_text()


def test_auto_steps_around_ids_given_explicitly(tmp_path: Path, claims: list[ActorIdClaim]) -> None:
    claims.append(resolve_actor_id("0", {}, tmp_path, 4))
    claims.append(resolve_actor_id(None, {ACTOR_ID_ENV: "1"}, tmp_path, 4))
    claims.append(resolve_actor_id("auto", {}, tmp_path, 4))
    assert claims[-1].actor_id == 2


def test_an_explicit_id_already_held_is_warned_about_but_kept(
    tmp_path: Path, claims: list[ActorIdClaim], caplog: pytest.LogCaptureFixture
) -> None:
    claims.append(resolve_actor_id("auto", {}, tmp_path, 4))
    with caplog.at_level(logging.WARNING, logger="zmqrl.actor.ids"):
        claims.append(resolve_actor_id("0", {}, tmp_path, 4))
    assert claims[-1].actor_id == 0 and not claims[-1].held
    assert any("already held" in r.getMessage() for r in caplog.records)


def test_a_released_id_is_free_again(tmp_path: Path, claims: list[ActorIdClaim]) -> None:
    first = resolve_actor_id("auto", {}, tmp_path, 2)
    first.release()
    first.release()  # idempotent
    claims.append(resolve_actor_id("auto", {}, tmp_path, 2))
    assert claims[-1].actor_id == 0


def test_past_num_actors_auto_goes_on_with_a_warning(
    tmp_path: Path, claims: list[ActorIdClaim], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="zmqrl.actor.ids"):
        claims.extend(resolve_actor_id("auto", {}, tmp_path, 2) for _ in range(3))
    assert [c.actor_id for c in claims] == [0, 1, 2]
    assert sum("past the configured ladder" in r.getMessage() for r in caplog.records) == 1


@pytest.mark.parametrize(
    ("option", "environ", "named"),
    [
        ("x", {}, "--id"),
        ("-1", {}, "--id"),
        ("1.5", {}, "--id"),
        (None, {ACTOR_ID_ENV: "first"}, ACTOR_ID_ENV),
        ("auto", {ACTOR_ID_ENV: "-2"}, ACTOR_ID_ENV),
    ],
)
def test_a_bad_value_names_where_it_came_from(
    tmp_path: Path, option: str | None, environ: dict[str, str], named: str
) -> None:
    with pytest.raises(ActorIdError, match=rf"^{named} must be an integer >= 0 or 'auto'"):
        resolve_actor_id(option, environ, tmp_path, 4)


# ----------------------------------------------------------------------------- across processes


def test_concurrent_claimants_get_distinct_ids_and_a_killed_ones_id_comes_back(tmp_path: Path) -> None:
    procs = [claimant(tmp_path, 3) for _ in range(4)]  # one more than num_actors
    try:
        ids = [claimed_id(p) for p in procs]
        assert sorted(ids) == [0, 1, 2, 3]
        victim = procs[ids.index(1)]
        victim.send_signal(signal.SIGKILL)  # no cleanup runs: the kernel alone drops the lock
        victim.wait(timeout=DEADLINE_S)
        replacement = claimant(tmp_path, 3)
        procs.append(replacement)
        assert claimed_id(replacement) == 1
    finally:
        finish(procs)


# ---------------------------------------------------------------------------------------- the CLI


def test_the_actor_command_refuses_a_bad_id_with_one_line(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"run:\n  dir: {tmp_path}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")}
    result = subprocess.run(
        [sys.executable, "-m", "zmqrl", "actor", str(config), "--id", "banana"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --id must be an integer >= 0 or 'auto', got 'banana'"
    ]


def test_the_actor_help_explains_the_three_sources_of_an_id(tmp_path: Path) -> None:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    result = subprocess.run(
        [sys.executable, "-m", "zmqrl", "actor", "--help"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert ACTOR_ID_ENV in result.stdout and "'auto'" in result.stdout
