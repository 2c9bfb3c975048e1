"""The dashboard's pure part (issue 11, item 1): the snapshot a supervisor builds from its slots,
its rendering on a 100-column terminal, the one-line form, and the snapshot's round trip through
msgpack and strict JSON. Slots are built by hand from heartbeats; no process, socket or thread."""

from __future__ import annotations

import io
import json
import math
import re
from pathlib import Path
from typing import Any

import msgpack
import pytest
from rich.console import Console

from zmqrl import strictjson
from zmqrl.agents.configs import APPOConfig
from zmqrl.config import Config
from zmqrl.runtime.health import BAD_LATEST_INFO_KEY
from zmqrl.supervisor.liveness import Liveness
from zmqrl.supervisor.render import SPARK_BLOCKS, plain_line, render_dashboard, sparkline
from zmqrl.supervisor.snapshot import (
    EVAL_HISTORY_LEN,
    RISING_HOLD_SECONDS,
    ProcessRow,
    RunSnapshot,
    SnapshotBuilder,
)
from zmqrl.supervisor.summary import Slot
from zmqrl.transport.wire import HeartbeatMsg

LAUNCHED = 1_000_000.0  # Unix seconds of the launch; the tests' wall clock starts there


def config(**learner: Any) -> Config:
    cfg = Config()
    cfg.learner.max_updates = 20_000
    cfg.agent.batch_size = 128
    for key, value in learner.items():
        setattr(cfg.learner, key, value)
    return cfg


def slot(role: str, index: int = 0, pid: int | None = None) -> Slot:
    return Slot(role, index, Liveness(started=0.0, pid=pid))


def beat(
    s: Slot, now: float, pid: int, state: str = "running", info: dict[str, str] | None = None, **c: Any
) -> None:
    """A heartbeat heard at supervisor clock ``now``, sent at wall time ``now`` too (rates use the
    sender's time, ages the supervisor's: one clock keeps the arithmetic readable)."""
    s.live.heard(HeartbeatMsg(s.role, s.id, pid, now, state, {"progress": now, **c}, info or {}), now)


def builder(cfg: Config | None = None, wall: float = LAUNCHED + 75.0) -> SnapshotBuilder:
    return SnapshotBuilder(cfg or config(), Path("runs/demo"), LAUNCHED, wall_clock=lambda: wall)


def text_of(snap: RunSnapshot, styles: bool = False) -> str:
    console = Console(record=True, width=100, file=io.StringIO(), color_system="truecolor")
    console.print(render_dashboard(snap))
    return console.export_text(styles=styles)


def line_of(text: str, start: str) -> str:
    """The first line that starts with ``start`` (style escapes aside)."""
    return next(
        line for line in text.splitlines() if re.sub(r"\x1b\[[0-9;]*m", "", line).strip().startswith(start)
    )


def a_run(b: SnapshotBuilder) -> dict[str, Slot]:
    """A learner, two actors and an evaluator, each heard twice one second apart, with a snapshot
    built between the two (the builder sees the heartbeats the slots hold when it builds)."""
    learner, a0, a1, ev = (
        slot("learner", pid=100),
        slot("actor", 0, 200),
        slot("actor", 1, 201),
        slot("evaluator"),
    )
    run = {s.name: s for s in (learner, a0, a1, ev)}
    for t, k in ((10.0, 0), (11.0, 1)):
        beat(
            learner,
            t,
            100,
            updates=5000 + 50 * k,
            updates_per_s=10.0,
            samples=40_000 + 1000 * k,
            samples_per_s=5.0,
            replay_size=25_000,
            replay_capacity=100_000,
            weights_version=12,
            policy_lag=1.5,
            sample_blocked_seconds=2.0 + 0.25 * k,
            insert_blocked_seconds=0.0,
            duration=500.0 + k,
            info={"host": "gpu1"},
        )
        beat(a0, t, 200, steps=1000 + 600 * k, steps_per_s=90.0, weights_version=11, recent_return=20.0)
        beat(a1, t, 201, steps=3000 + 400 * k, steps_per_s=80.0, weights_version=12, recent_return=30.0)
        beat(
            ev,
            t,
            300,
            state="evaluating",
            evaluations=3,
            eval_return=150.0,
            eval_best=160.0,
            weights_version=12,
        )
        if k == 0:
            b.build(run, now=t + 0.5)
    return run


def built(cfg: Config | None = None, now: float = 11.5) -> RunSnapshot:
    b = builder(cfg)
    return b.build(a_run(b), now=now)


def test_every_process_has_a_row_with_its_recent_figures() -> None:
    cfg = config()
    cfg.evaluator.enabled = True
    text = text_of(built(cfg))
    learner = line_of(text, "learner-0")
    assert "100@gpu1" in learner and "running" in learner and "50.0 upd/s" in learner
    assert "v12" in learner and "1.5" in learner  # its policy_lag counter
    actor = line_of(text, "actor-0")
    assert "200" in actor and "600 steps/s" in actor and "v11" in actor
    assert actor.split()[-1] == "1.0"  # one version behind the learner's
    assert "400 steps/s" in line_of(text, "actor-1")
    assert "evaluating" in line_of(text, "evaluator-0") and "3 evals" in line_of(text, "evaluator-0")
    assert "zmqrl runs/demo" in text and "elapsed 1m15s" in text
    assert "eval 150.0 (best 160.0)" in text and "train 25.0" in text


def test_rates_are_recent_not_lifetime_and_a_new_pid_starts_from_its_own_rate() -> None:
    actor, b = slot("actor", 0, 200), builder()
    beat(actor, 10.0, 200, steps=1000, steps_per_s=90.0)
    run = {"actor-0": actor}
    assert b.build(run, now=10.1).processes[0].rate == 90.0  # one heartbeat of pid 200: its own rate
    beat(actor, 11.0, 200, steps=2000, steps_per_s=95.0)
    assert b.build(run, now=11.1).processes[0].rate == 1000.0
    assert b.build(run, now=11.6).processes[0].rate == 1000.0  # a faster refresh keeps it
    beat(actor, 13.0, 200, steps=2500, steps_per_s=94.0)
    assert b.build(run, now=13.1).processes[0].rate == 250.0  # slowed down: the lifetime rate hides it
    beat(actor, 14.0, 999, steps=10, steps_per_s=7.0)  # restarted: counts from zero
    assert b.build(run, now=14.1).processes[0].rate == 7.0


def test_heartbeat_age_and_a_process_not_heard_yet() -> None:
    run = a_run(builder())
    run["actor-2"] = slot("actor", 2, pid=202)
    text = text_of(builder().build(run, now=13.5))
    assert "2.5 s" in line_of(text, "actor-0")
    silent = line_of(text, "actor-2")
    assert "202" in silent and "starting" in silent and "steps/s" not in silent


def test_restarting_given_up_finished_and_down_slots_say_so() -> None:
    run = a_run(builder())
    run["actor-0"].restart_at = 14.2
    run["actor-0"].exit_code = 1
    run["actor-0"].restart_times = [3.0, 8.0]
    run["actor-1"].retired, run["actor-1"].exit_code = True, 3
    done, late = slot("actor", 2, 202), slot("actor", 3, 203)
    done.retired, done.exit_code = True, 0
    beat(late, 1.0, 203)
    run.update({"actor-2": done, "actor-3": late})
    snap = builder().build(run, now=13.0)
    text = text_of(snap)
    restarting = line_of(text, "actor-0")
    assert "restarting in 1.2 s" in restarting and re.search(r"2\.0 s +2 ", restarting)
    assert "given up" in line_of(text, "actor-1")
    assert "finished" in line_of(text, "actor-2")
    assert "down" in line_of(text, "actor-3")  # silent longer than supervisor.heartbeat_timeout
    assert snap.actors_alive == 0 and snap.counters["restarts"] == 2
    assert "given up" in line_of(text_of(snap, styles=True), "actor-1") and "\x1b[1;31m" in text_of(
        snap, True
    )


def test_progress_bar_shows_the_share_of_updates_and_the_eta_from_the_recent_rate() -> None:
    snap = built()
    assert snap.progress == pytest.approx(5050 / 20_000)
    assert snap.eta_seconds == pytest.approx((20_000 - 5050) / 50.0)
    progress = line_of(text_of(snap), "updates 5050/20000")
    assert "━" in progress and " 25%" in progress and "ETA 4m59s" in progress


def test_a_time_limit_that_ends_the_run_sooner_drives_the_bar() -> None:
    snap = built(config(max_seconds=600.0))
    assert snap.progress_label == "time 501/600 s" and snap.eta_seconds == pytest.approx(99.0)
    assert " 84%" in line_of(text_of(snap), "time 501/600 s")


def test_replay_fill_ratio_and_limiter_wait() -> None:
    snap = built()
    assert snap.samples_in_per_s == 1000.0 and snap.samples_trained_per_s == 50.0 * 128
    assert snap.replay_ratio == pytest.approx(6.4) and snap.limiter_wait_share == 0.25
    text = text_of(snap)
    assert "25000/100000 (25% full)" in line_of(text, "replay") and "waited 25%" in line_of(text, "replay")
    flow = line_of(text, "samples")
    assert "in 1000/s" in flow and "trained 6400/s" in flow and "ratio 6.40" in flow


def test_an_on_policy_run_names_its_store_the_queue() -> None:
    cfg = config()
    cfg.agent = APPOConfig()
    assert built(cfg).replay_label == "queue" and built().replay_label == "replay"
    assert "queue 25000/100000" in plain_line(built(cfg))


def test_a_rising_counter_is_marked_until_it_stops_rising() -> None:
    b = builder()
    run = a_run(b)
    assert "+" not in line_of(text_of(b.build(run, now=11.5)), "messages")
    beat(run["learner-0"], 12.0, 100, lost_batches=3, bad_messages=1)
    snap = b.build(run, now=12.0)
    assert snap.rising == ["bad_messages", "lost_batches"] and snap.rises["lost_batches"] == 3
    messages = line_of(text_of(snap), "messages")
    assert "lost 3 +3" in messages and "bad 1 +1" in messages and "stale 0 |" in messages
    styled = line_of(text_of(snap, styles=True), "messages")
    assert re.search(r"\x1b\[1;31mlost 3", styled)
    assert b.build(run, now=12.5).rising == ["bad_messages", "lost_batches"]  # held a moment
    beat(run["learner-0"], 13.0, 100, lost_batches=3, bad_messages=1)
    calm = b.build(run, now=12.0 + RISING_HOLD_SECONDS + 0.1)
    assert calm.rising == [] and "lost 3 |" in line_of(text_of(calm), "messages")
    assert "\x1b[1;31m" not in line_of(text_of(calm, styles=True), "messages")


def test_while_bad_messages_rise_the_lines_say_why_the_newest_was_dropped_escaped() -> None:
    """Every message dropped is a run that never trains: the operator's line says why at once,
    not only the learner's log. The reason may quote a peer's bytes: nothing unprintable reaches
    the terminal."""
    b = builder()
    run = a_run(b)
    why = "obs component 0 is 0.6, outside [-0.01, 0.01] \x1b[2J(transport.max_abs_obs)"
    beat(run["learner-0"], 12.0, 100, info={BAD_LATEST_INFO_KEY: why}, bad_messages=5)
    snap = b.build(run, now=12.0)
    assert "\x1b" not in snap.bad_latest and snap.bad_latest.startswith("obs component 0 is 0.6")
    assert plain_line(snap).endswith(f"bad_messages +5 (latest: {snap.bad_latest})")
    assert f"latest dropped: {snap.bad_latest[:40]}" in text_of(snap)
    assert RunSnapshot.from_dict(json.loads(json.dumps(snap.to_dict()))).bad_latest == snap.bad_latest
    beat(run["learner-0"], 13.0, 100, info={BAD_LATEST_INFO_KEY: why}, bad_messages=5)
    calm = b.build(run, now=12.0 + RISING_HOLD_SECONDS + 0.1)  # no new drop: no reason shown
    assert "latest" not in plain_line(calm) and "latest dropped" not in text_of(calm)


def test_a_restarted_process_counting_from_zero_neither_hides_nor_fakes_a_rise() -> None:
    b = builder()
    run = a_run(b)
    beat(run["actor-0"], 12.0, 200, bad_messages=4)
    b.build(run, now=12.0)
    beat(run["actor-0"], 20.0, 777, bad_messages=0)  # its replacement
    quiet = b.build(run, now=20.0)
    assert quiet.counters["bad_messages"] == 4 and "bad_messages" not in quiet.rising
    beat(run["actor-0"], 21.0, 777, bad_messages=2)
    risen = b.build(run, now=21.0)
    assert risen.counters["bad_messages"] == 6 and risen.rises["bad_messages"] == 2


def test_sparkline_shapes() -> None:
    rising = sparkline([float(v) for v in range(8)])
    assert rising == SPARK_BLOCKS
    assert list(rising) == sorted(rising)
    assert sparkline([]) == "" and sparkline([5.0, 5.0]) == SPARK_BLOCKS[3] * 2
    assert sparkline([1.0, math.nan, 3.0]) == f"{SPARK_BLOCKS[0]} {SPARK_BLOCKS[-1]}"
    assert len(sparkline([float(v) for v in range(100)], width=20)) == 20


def test_eval_history_grows_with_the_evaluation_count() -> None:
    cfg = config()
    cfg.evaluator.enabled = True
    b = builder(cfg)
    run = a_run(b)
    assert b.build(run, now=11.5).eval_history == [150.0]
    assert b.build(run, now=11.6).eval_history == [150.0]  # the same evaluation seen again
    for n, ret in ((4, 170.0), (5, 170.0)):  # an equal return is still a new evaluation
        beat(run["evaluator-0"], 11.0 + n, 300, evaluations=n, eval_return=ret, eval_best=170.0)
        snap = b.build(run, now=11.0 + n)
    assert snap.eval_history == [150.0, 170.0, 170.0]
    for n in range(6, 6 + EVAL_HISTORY_LEN):
        beat(run["evaluator-0"], 11.0 + n, 300, evaluations=n, eval_return=float(n))
        snap = b.build(run, now=11.0 + n)
    assert len(snap.eval_history) == EVAL_HISTORY_LEN and snap.eval_history[-1] == 45.0
    assert sparkline(snap.eval_history) in line_of(text_of(snap), "return")


def test_without_a_count_the_history_grows_when_the_learners_return_changes() -> None:
    learner, b = slot("learner", pid=100), builder()
    for t, ret in ((1.0, math.nan), (2.0, 10.0), (3.0, 10.0), (4.0, 12.0)):
        beat(learner, t, 100, eval_return=ret)
        snap = b.build({"learner-0": learner}, now=t)
    assert snap.eval_history == [10.0, 12.0]


def test_not_measured_values_render_as_a_dash_and_serialise_as_none() -> None:
    learner = slot("learner", pid=100)
    beat(learner, 1.0, 100, eval_return=math.nan, eval_best=math.nan, policy_lag=math.nan)
    snap = builder().build({"learner-0": learner}, now=1.0)
    text = text_of(snap)
    assert "eval - (best -)" in text and "train -" in text
    assert line_of(text, "learner-0").split()[-1] == "-"
    plain = snap.to_dict()
    assert plain["eval_return"] is None and plain["processes"][0]["policy_lag"] is None
    strictjson.loads_strict(json.dumps(plain, allow_nan=False))
    assert text_of(RunSnapshot())  # an empty snapshot renders too


def test_round_trip_through_msgpack_and_strict_json() -> None:
    b = builder()
    run = a_run(b)
    b.build(run, now=11.5)
    beat(run["learner-0"], 12.0, 100, stale_batches=2, eval_return=math.nan)
    snap = b.build(run, now=12.0)
    plain = snap.to_dict()
    via_json = RunSnapshot.from_dict(strictjson.loads_strict(json.dumps(plain, allow_nan=False)))
    via_msgpack = RunSnapshot.from_dict(msgpack.unpackb(msgpack.packb(plain), raw=False))
    assert via_json.to_dict() == plain and via_msgpack.to_dict() == plain
    assert via_json.processes[0] == snap.processes[0] and via_json.rises == {"stale_batches": 2}
    assert math.isnan(RunSnapshot.from_dict({"samples_in_per_s": None}).samples_in_per_s)


def test_from_dict_rejects_wrong_types_and_tolerates_missing_keys() -> None:
    assert RunSnapshot.from_dict({}) == RunSnapshot()
    partial = RunSnapshot.from_dict({"run_dir": "r", "processes": [{"role": "actor"}], "future": 1})
    assert partial.run_dir == "r" and partial.processes == [ProcessRow("actor", 0)]
    for bad in (
        {"replay_size": "12"},
        {"replay_size": 1.5},
        {"elapsed": True},
        {"eval_history": [1.0, "x"]},
        {"counters": {"bad_messages": None}},
        {"processes": {"role": "actor"}},
        {"processes": [{"pid": "12"}]},
        {"rising": "bad_messages"},
    ):
        with pytest.raises(ValueError):
            RunSnapshot.from_dict(bad)
    with pytest.raises(ValueError):
        RunSnapshot.from_dict([])  # type: ignore[arg-type]


def test_plain_line_keeps_the_parts_tests_and_scripts_grep() -> None:
    line = plain_line(built())
    assert re.search(r"updates (\d+)/\d+ \|", line).group(1) == "5050"  # type: ignore[union-attr]
    assert re.search(r"updates \d+/\d+ \| samples (\d+) ", line).group(1) == "41000"  # type: ignore[union-attr]
    assert "| 50 upd/s |" in line and "eval - (best -)" in line  # no evaluator: the learner's
    assert "actors 2/2, 1000 steps/s" in line and "replay 25000/100000" in line


def test_a_run_of_eight_actors_fits_a_100_by_30_terminal() -> None:
    b = builder()
    run = a_run(b)
    for i in range(2, 8):
        s = slot("actor", i, 200 + i)
        beat(s, 11.0, 200 + i, steps=1234567, steps_per_s=12345.6, weights_version=123456, recent_return=1.0)
        run[s.name] = s
    lines = text_of(b.build(run, now=11.5)).rstrip("\n").splitlines()
    assert len(lines) <= 30 and max(len(line) for line in lines) <= 100
    assert sum(1 for line in lines if line.strip().startswith("actor-")) == 8


def test_a_replacement_not_heard_yet_is_starting_though_the_slot_keeps_its_predecessors_beat() -> None:
    b = builder()
    run = a_run(b)
    old = run["actor-0"]
    run["actor-0"] = replacement = Slot("actor", 0, old.live.renew(12.0, 555), restart_times=[12.0])
    row = b.build(run, now=12.5).processes[2]
    assert replacement.last is not None  # renew() carries the last heartbeat over
    assert (row.pid, row.state, row.heartbeat_age, row.weights_version) == (555, "starting", None, None)
    assert math.isnan(row.rate) and row.restarts == 1


def test_many_processes_are_cut_to_max_rows_with_a_count_of_the_rest() -> None:
    run = {f"actor-{i}": slot("actor", i, 200 + i) for i in range(40)}
    text = text_of(builder().build(run, now=1.0))
    assert sum(1 for line in text.splitlines() if line.startswith("actor-")) == 16
    assert "... 24 more" in text and len(text.splitlines()) <= 30


def test_without_an_update_rate_the_limit_nearer_its_end_drives_the_bar() -> None:
    learner = slot("learner", pid=100)
    beat(learner, 1.0, 100, updates=100, updates_per_s=0.0, duration=450.0)
    snap = builder(config(max_seconds=500.0)).build({"learner-0": learner}, now=1.0)
    assert snap.progress == pytest.approx(0.9) and snap.eta_seconds == pytest.approx(50.0)
    no_limit = builder().build({"learner-0": learner}, now=1.0)
    assert no_limit.progress_label == "updates 100/20000" and no_limit.eta_seconds is None
    assert "ETA -" in line_of(text_of(no_limit), "updates 100/20000")
