"""learner.stop_at_target ends a run once the target is held, and every summary ends by naming the
checkpoint to deploy: serial mode, a real launch (the learner evaluating, or the evaluator), the
watch-only supervisor's relay, and the deploy rule on its own."""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import zmq

from tests.conftest import (
    REPO,
    launch_to_the_end,
    processes_mentioning,
    tiny_config,
    tiny_overrides,
    wait_until,
)
from zmqrl import api
from zmqrl.checkpoints.choice import choose_deployment
from zmqrl.cli.launch import serial_summary
from zmqrl.config import load_config
from zmqrl.errors import ConfigError
from zmqrl.evaluator.greedy import EvalResult, EvalTracker
from zmqrl.serial import run_serial
from zmqrl.supervisor.summary import Reporter
from zmqrl.supervisor.watch import Watcher
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.control import ControlPublisher, ControlSubscriber, HeartbeatSender
from zmqrl.transport.wire import HeartbeatMsg

CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
LIMITS = sockets.SocketLimits(samples_hwm=2, linger_ms=0)
# Every CartPole episode lasts at least this many steps, so any policy reaches and holds it: a
# target that is met at the first evaluations, whatever the training did.
EASY_TARGET = 5


def target_overrides(**extra: object) -> dict[str, object]:
    """A run long enough that only the target can end it early: held at the 2nd evaluation."""
    return {
        "learner__max_updates": 3000,
        "learner__eval_interval": 40,
        "learner__target_return": EASY_TARGET,
        "learner__target_hold": 2,
        **extra,
    }


def result(mean: float) -> EvalResult:
    return EvalResult(mean, 0.0, [mean], [1])


# ------------------------------------------------------------------ the rule


def test_holding_is_about_the_latest_evaluations_not_the_first_time_it_happened() -> None:
    tracker = EvalTracker(target=100.0, hold=2)
    for mean in (120.0, 130.0):
        tracker.add(result(mean))
    assert tracker.held is not None and tracker.holding
    tracker.add(result(10.0))
    assert tracker.held is not None and not tracker.holding, "held once is on record; it holds no more"
    resumed = EvalTracker(target=100.0, hold=2)
    resumed.load_state(tracker.state())
    resumed.add(result(150.0))
    assert not resumed.holding
    resumed.add(result(150.0))
    assert resumed.holding
    assert not EvalTracker(target=None).holding


def test_stop_at_target_without_a_target_is_one_error_naming_the_key_and_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("learner:\n  stop_at_target: true\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(str(path)) and "learner.stop_at_target" in message
    assert "learner.target_return" in message
    with pytest.raises(ConfigError, match=r"^--set 'learner\.stop_at_target=true': "):
        load_config(None, ["learner.stop_at_target=true"])
    assert load_config(
        None, ["learner.stop_at_target=true", "learner.target_return=10"]
    ).learner.stop_at_target
    assert load_config(None).learner.stop_at_target is False  # off by default


# ------------------------------------------------------------------ serial mode and zmqrl.train


def test_a_serial_run_stops_once_the_target_is_held_and_says_so(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, **target_overrides(learner__stop_at_target="true"))
    started = time.monotonic()
    stats = run_serial(cfg)
    learner = stats["learner"]
    assert learner["state"] == "finished" and learner["ended"] == "target held"
    assert learner["updates"] == 80, "held at the second evaluation, 2 x eval_interval"
    assert learner["target_held"]["updates"] == 80
    assert (cfg.run_dir / "checkpoints" / "latest").is_file(), "the final checkpoint is written"
    assert json.loads((cfg.run_dir / "learner-stats.json").read_text())["ended"] == "target held"
    lines = serial_summary(stats, cfg.run_dir, time.monotonic() - started, cfg.learner)
    assert lines[0].startswith("serial run finished (the target return held) in "), lines
    assert any(
        line.startswith(f"stopped at target: held {EASY_TARGET} for 2 evaluations at ") for line in lines
    ), lines
    best = cfg.run_dir / "checkpoints" / "best"
    assert lines[-1].startswith(f"deploy: {best}, the best evaluated weights (eval "), lines
    assert f"zmqrl eval {best}" in lines[-1]
    assert stats["deploy"]["path"] == str(best)


def test_off_by_default_a_run_that_holds_the_target_goes_on_to_max_updates(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, **target_overrides(learner__max_updates=200))
    stats = run_serial(cfg)
    learner = stats["learner"]
    assert learner["target_held"] is not None, "held, but not asked to stop there"
    assert learner["updates"] == 200 and learner["ended"] == "max_updates"


def test_train_returns_why_the_run_ended_and_the_checkpoint_to_deploy(run_root: Path) -> None:
    cfg = tiny_config(run_root, **target_overrides(learner__stop_at_target="true"))
    trained = api.train(cfg, mode="serial")
    assert trained.ended == "target held" and trained.updates == 80
    assert trained.deploy_path == trained.run_dir / "checkpoints" / "best"
    assert trained.deploy["eval_return"] >= EASY_TARGET
    on_disk = json.loads((trained.run_dir / "stats.json").read_text())
    assert on_disk["deploy"]["path"] == str(trained.deploy_path)


# ------------------------------------------------------------------ which checkpoint to deploy


def touch(*paths: Path) -> None:
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"")


def test_deploy_best_when_it_exists_and_say_both_scores(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    touch(ckpts / "best", ckpts / "latest")
    history = [
        {"mean": 500.0, "std": 0.0, "weights_version": 123, "seconds": 14.2},
        {"mean": 431.0, "std": 20.0, "weights_version": 200, "seconds": 30.0},
    ]
    choice = choose_deployment(tmp_path, {"weights_version": 200}, {"eval_history": history})
    assert choice.path == ckpts / "best" and choice.eval_return == 500.0
    assert choice.final_eval_return == 431.0
    assert choice.why == (
        "the best evaluated weights (eval 500.0 ± 0.0, weights v123, 14.2 s after launch); "
        "the final weights scored 431.0 (checkpoints/latest)"
    )
    # The evaluator did not get to the final weights: their score is not known.
    unscored = choose_deployment(tmp_path, {"weights_version": 250}, {"eval_history": history})
    assert "the final weights (checkpoints/latest) were not evaluated" in unscored.why


def test_deploy_latest_when_there_is_no_best_and_nothing_when_there_is_no_checkpoint(tmp_path: Path) -> None:
    assert choose_deployment(tmp_path, {}).path is None
    assert choose_deployment(tmp_path, {}).line().startswith("deploy: nothing")
    touch(tmp_path / "checkpoints" / "latest")
    choice = choose_deployment(tmp_path, {"updates": 300, "eval_history": []})
    assert choice.path == tmp_path / "checkpoints" / "latest"
    assert "the final weights, not evaluated" in choice.why and "no checkpoints/best" in choice.why


def write_learner_stats(run_dir: Path, **stats: Any) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "learner-stats.json").write_text(json.dumps({"updates": 80, "state": "finished", **stats}))


@pytest.mark.parametrize(
    ("state", "ended", "line"),
    [
        ("finished", "max_updates", "learner finished (learner.max_updates reached)"),
        ("finished", "max_seconds", "learner finished (learner.max_seconds passed)"),
        ("finished", "actor max_steps", "learner finished (every actor reached actor.max_steps)"),
        ("finished", "target held", "learner finished (the target return held)"),
        ("finished", "something newer", "learner finished"),
        ("stopped", "stopped", "learner stopped"),
    ],
)
def test_the_summary_says_why_the_learner_finished(tmp_path: Path, state: str, ended: str, line: str) -> None:
    """A run that ended by itself says which limit ended it: a run cut by max_seconds with 0
    updates otherwise read like one that trained to the end."""
    cfg = tiny_config(tmp_path)
    write_learner_stats(cfg.run_dir, state=state, ended=ended)
    learner = SimpleNamespace(role="learner", id=0, last=None, restarts=0, exit_code=0, end=state)
    out = io.StringIO()
    Reporter(cfg, cfg.run_dir, out, lambda _: None).final({"learner-0": learner}, {"launched": 0.0})
    assert line in out.getvalue().splitlines(), out.getvalue()


@pytest.mark.parametrize("with_best", [True, False], ids=["best-present", "best-absent"])
def test_the_launch_summary_ends_with_the_deploy_line_and_stats_json_holds_it(
    tmp_path: Path, with_best: bool
) -> None:
    cfg = tiny_config(tmp_path, **target_overrides(learner__stop_at_target="true"))
    held = {"mean": 9.0, "std": 0.0, "updates": 80, "samples": 1500, "seconds": 2.5}
    history = [{"mean": 10.0, "std": 0.0, "updates": 40, "samples": 700, "seconds": 1.5}, held]
    write_learner_stats(cfg.run_dir, ended="target held", target_held=held, eval_history=history)
    touch(cfg.run_dir / "checkpoints" / "latest", *([cfg.run_dir / "checkpoints" / "best"] * with_best))
    out = io.StringIO()
    summary = Reporter(cfg, cfg.run_dir, out, lambda _: None).final({}, {"launched": 0.0})
    lines = out.getvalue().strip().splitlines()
    assert (
        "stopped at target: held 5 for 2 evaluations at 2.5 s after launch (80 updates, 1500 env steps)"
        in lines
    )
    which = "best" if with_best else "latest"
    assert lines[-1].startswith(f"deploy: {cfg.run_dir / 'checkpoints' / which}, "), lines[-1]
    written = json.loads((cfg.run_dir / "stats.json").read_text())
    assert written["deploy"] == json.loads(json.dumps(summary["deploy"]))
    assert written["deploy"]["path"] == str(cfg.run_dir / "checkpoints" / which)
    assert written["deploy"]["eval_return"] == (10.0 if with_best else 9.0)


# ------------------------------------------------------------------ the supervisor's word to the learner


def test_the_end_request_rides_on_the_supervisors_heartbeat_which_old_roles_read_as_before(
    ctx: zmq.Context,
) -> None:
    pub, endpoint = sockets.control_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    sub = ControlSubscriber(sockets.control_sub(ctx, endpoint, LIMITS), BadMessages("ctl"))
    supervisor = ControlPublisher(pub)
    supervisor.request_end("target held")
    supervisor.request_end("something else")  # the first reason stays
    deadline = time.monotonic() + 10
    while sub.end_request is None:  # PUB/SUB: resend until one is through
        assert time.monotonic() < deadline, "the end request never arrived"
        supervisor.heartbeat()
        assert sub.poll_stop() is None, "an end request is no stop"
        time.sleep(0.02)
    assert sub.end_request == "target held" and sub.bad.count == 0
    frames = wire.dump(HeartbeatMsg("supervisor", 0, 1, 0.0, "running", {}, {"end": "target held"}))
    assert isinstance(wire.load(frames), HeartbeatMsg), "a heartbeat any role already decodes"


def test_the_reporter_asks_for_the_end_only_when_stop_at_target_is_on(tmp_path: Path) -> None:
    beat = HeartbeatMsg("evaluator", 0, 1, 0.0, "running", {"target_held_time": 123.0}, {})
    said: list[str] = []
    for stop, expected in (("false", None), ("true", "target held")):
        cfg = tiny_config(
            tmp_path, **target_overrides(learner__stop_at_target=stop, evaluator__enabled="true")
        )
        reporter = Reporter(cfg, tmp_path, io.StringIO(), said.append)
        reporter.heard({}, HeartbeatMsg("evaluator", 0, 1, 0.0, "running", {}, {}))
        assert reporter.end_request is None, "not held yet"
        reporter.heard({}, beat)
        assert reporter.end_request == expected
    assert said == [
        "the evaluator held target return 5 for 2 evaluations in a row: "
        "ending the run (learner.stop_at_target)"
    ]


def test_supervise_passes_the_evaluators_held_target_on_to_the_learner(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    """The watch-only supervisor (compose, Kubernetes) relays it as launch does: roles it did not
    start, played here by sockets, hear the request on the control channel."""
    cfg = tiny_config(
        tmp_path,
        **target_overrides(
            learner__stop_at_target="true", evaluator__enabled="true", supervisor__stop_grace=2.0
        ),
    )
    out = io.StringIO()
    watcher = Watcher(cfg, out=out, ctx=ctx, dashboard=False)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(watcher.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: not watcher.cfg.transport.control.endswith(":0"), 20, "the watcher to bind")
        push = sockets.heartbeat_push(ctx, watcher.cfg.transport.heartbeat, LIMITS)
        learner_side = ControlSubscriber(
            sockets.control_sub(ctx, watcher.cfg.transport.control, LIMITS), BadMessages("c")
        )
        evaluator = HeartbeatSender(push, "evaluator", 0, interval=0.1)
        learner = HeartbeatSender(push, "learner", 0, interval=0.1)
        deadline = time.monotonic() + 20
        while learner_side.end_request is None:
            assert time.monotonic() < deadline, f"no end request on the control channel:\n{out.getvalue()}"
            learner.beat("running", {"updates": 10})
            evaluator.beat("running", {"evaluations": 2, "target_held_time": time.time()})
            learner_side.poll_stop()
            time.sleep(0.05)
        assert learner_side.end_request == "target held"
        learner.beat("finished", {"updates": 12})
        evaluator.beat("stopped", {"evaluations": 3})
        thread.join(timeout=20)
        assert not thread.is_alive() and codes == [0], out.getvalue()
        assert "ending the run (learner.stop_at_target)" in out.getvalue()
    finally:
        watcher._signal = watcher._signal or 2  # a failed assertion must not leave it running
        thread.join(timeout=10)


# ------------------------------------------------------------------ real launches


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.mark.slow
def test_a_launched_run_whose_learner_evaluates_stops_at_the_target(run_root: Path) -> None:
    overrides = tiny_overrides(run_root, **target_overrides(learner__stop_at_target="true"))
    result = launch_to_the_end(CONFIG, overrides, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    learner = json.loads((run_root / "t" / "learner-stats.json").read_text())
    assert learner["state"] == "finished" and learner["ended"] == "target held"
    assert learner["updates"] == 80
    assert f"stopped at target: held {EASY_TARGET} for 2 evaluations at " in result.stdout
    best = run_root / "t" / "checkpoints" / "best"
    assert last_line(result.stdout).startswith(f"deploy: {best}, "), result.stdout
    assert json.loads((run_root / "t" / "stats.json").read_text())["deploy"]["path"] == str(best)
    assert processes_mentioning(str(run_root)) == []


@pytest.mark.slow
@pytest.mark.heavy  # a real launch: kept out of the ~10-minute default suite
def test_with_the_evaluator_the_supervisor_tells_the_learner_to_stop_at_the_target(run_root: Path) -> None:
    overrides = tiny_overrides(
        run_root,
        **target_overrides(
            learner__stop_at_target="true",
            learner__max_updates=200_000,  # only the evaluator's word ends it early
            learner__max_seconds=60,
            evaluator__enabled="true",
            evaluator__episodes=2,
            evaluator__interval_seconds=0.2,
        ),
    )
    result = launch_to_the_end(CONFIG, overrides, timeout=90)
    assert result.returncode == 0, result.stdout + result.stderr
    run_dir = run_root / "t"
    learner = json.loads((run_dir / "learner-stats.json").read_text())
    evaluator = json.loads((run_dir / "evaluator-stats.json").read_text())
    assert learner["state"] == "finished" and learner["ended"] == "target held", learner
    assert evaluator["target_held"] is not None
    assert "the evaluator held target return 5 for 2 evaluations in a row" in result.stdout
    assert "stopped at target: held 5 for 2 evaluations at " in result.stdout
    assert last_line(result.stdout).startswith(f"deploy: {run_dir / 'checkpoints' / 'best'}, "), result.stdout
    assert processes_mentioning(str(run_root)) == []
