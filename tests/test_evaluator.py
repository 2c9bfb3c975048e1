"""The evaluator role against an in-test weights publisher and supervisor (threads over 127.0.0.1),
and replaying its checkpoints: greedy play, weights-only loading, video recording."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import torch
import zmq
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

from tests.conftest import ANY_PORT, tiny_config, wait_until
from zmqrl.checkpoints.files import LATEST, load_checkpoint, save_checkpoint
from zmqrl.checkpoints.policy import make_eval_agent
from zmqrl.config import Config
from zmqrl.envs.factory import make_env
from zmqrl.evaluator.greedy import (
    EvaluationAborted,
    VideoUnavailable,
    evaluate,
    evaluate_checkpoint,
)
from zmqrl.evaluator.main import Evaluator
from zmqrl.evaluator.scoring import stored_best_score
from zmqrl.metrics import NullLogger
from zmqrl.runtime.link import LEARNER_FAILED, SupervisorLink
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import WeightsPublisher
from zmqrl.transport.wire import HeartbeatMsg, StopMsg
from zmqrl.types import Weights

# CartPole episodes are cut here, so a policy that balances scores exactly this.
EPISODE_CAP = 50
# A CartPole whose frames need no pygame (classic-control draws with it), for the video tests.
FRAMED_CARTPOLE = "ZmqrlTest/FramedCartPole-v0"


class FramedCartPole(CartPoleEnv):
    """CartPole drawing its own tiny RGB frames: a white column where the cart is."""

    def render(self) -> np.ndarray:
        frame = np.zeros((64, 96, 3), np.uint8)
        x = 0.0 if self.state is None else float(self.state[0])
        frame[:, int(np.clip((x + 2.4) / 4.8 * 95, 0, 95))] = 255
        return frame


def framed_cartpole(**kwargs: Any) -> gym.Env[Any, Any]:
    return FramedCartPole(**kwargs)


if FRAMED_CARTPOLE not in gym.registry:
    gym.register(FRAMED_CARTPOLE, entry_point=framed_cartpole, max_episode_steps=500)


class SupervisorDouble:
    """Binds the heartbeat and control sockets like the supervisor; records heartbeats."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.pull = ctx.socket(zmq.PULL)
        self.pull.bind(ANY_PORT)
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind(ANY_PORT)
        self.heartbeats: list[HeartbeatMsg] = []

    def endpoints(self) -> dict[str, str]:
        return {
            "heartbeat": self.pull.getsockopt_string(zmq.LAST_ENDPOINT),
            "control": self.pub.getsockopt_string(zmq.LAST_ENDPOINT),
        }

    def drain(self) -> list[HeartbeatMsg]:
        """Every heartbeat received so far (those queued now are added first)."""
        while self.pull.poll(0):
            msg = wire.load(self.pull.recv_multipart())
            assert isinstance(msg, HeartbeatMsg)
            self.heartbeats.append(msg)
        return self.heartbeats

    def stop(self, reason: str = "test says stop") -> None:
        self.pub.send_multipart(wire.dump(StopMsg(reason)))

    def close(self) -> None:
        self.pull.close(0)
        self.pub.close(0)


class LearnerDouble:
    """The learner's side of the weights channel: a real PUB socket and WeightsPublisher."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.sock, self.endpoint = sockets.weights_pub(ctx, ANY_PORT, sockets.SocketLimits())
        self.publisher = WeightsPublisher(self.sock, "dqn")

    def publish_until(self, weights: Weights | None, done: Any, timeout: float, what: str) -> None:
        """Publish ``weights`` (or announce the learner's stop) every 50 ms until ``done()``: a
        subscriber may join late, as an evaluator started after the learner does."""
        deadline = time.monotonic() + timeout
        while not done():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            if weights is None:
                self.publisher.announce_stop("learner finished")
            else:
                self.publisher.publish(weights)
            time.sleep(0.05)

    def close(self) -> None:
        self.sock.close(0)


def evaluator_config(
    tmp_path: Path, sup: SupervisorDouble, learner: LearnerDouble, **extra: object
) -> Config:
    values: dict[str, object] = {
        "env__max_episode_steps": EPISODE_CAP,
        "evaluator__episodes": 2,
        "evaluator__interval_seconds": 0,
    }
    values.update(extra)
    cfg = tiny_config(tmp_path, **values)
    ends = sup.endpoints()
    transport = dataclasses.replace(
        cfg.transport, weights=learner.endpoint, heartbeat=ends["heartbeat"], control=ends["control"]
    )
    return dataclasses.replace(cfg, transport=transport)


def initial_weights(cfg: Config) -> dict[str, np.ndarray]:
    env = make_env(cfg.env, training=False)
    try:
        return make_eval_agent(cfg, env, seed=cfg.run.seed).export_weights()
    finally:
        env.close()


def balancing_weights(reference: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An MLP Q-net (two hidden layers) acting as the textbook CartPole controller: push the way
    the pole falls (angle + angular velocity). Hidden unit 0 carries s = angle + velocity when
    positive, unit 1 carries -s; Q(right) = unit 0, Q(left) = unit 1."""
    w = {name: np.zeros_like(array) for name, array in reference.items()}
    w["torso.0.weight"][0, 2:] = 1.0
    w["torso.0.weight"][1, 2:] = -1.0
    w["torso.2.weight"][0, 0] = w["torso.2.weight"][1, 1] = 1.0
    w["head.weight"][1, 0] = w["head.weight"][0, 1] = 1.0
    return w


def beats_past_one_more_tick(
    sup: SupervisorDouble, shows: Callable[[HeartbeatMsg], bool], what: str
) -> list[HeartbeatMsg]:
    """The heartbeats that pass ``shows``, once they carry two different progress counts.

    A beat reads the evaluator's counters when it is sent, so the first beat that shows a state
    went out after the main loop got there, at its tick ``p`` or later; a beat with more progress
    went out after a later tick, so the loop had gone round once more and acted on that state.
    A proof by the loop's own count that it had its chance to misbehave, not a wall-clock window."""

    def showing() -> list[HeartbeatMsg]:
        return [hb for hb in sup.drain() if shows(hb)]

    wait_until(lambda: len({hb.counters["progress"] for hb in showing()}) >= 2, 20, what)
    return showing()


def final_beat(sup: SupervisorDouble) -> list[HeartbeatMsg]:
    """Every heartbeat, once the evaluator's last one (sent as it stops) has arrived."""
    wait_until(lambda: any(hb.state == "stopped" for hb in sup.drain()), 10, "the final heartbeat")
    return sup.drain()


def start(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_evaluator_scores_each_new_version_once_and_keeps_the_best_weights(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    sup, learner = SupervisorDouble(ctx), LearnerDouble(ctx)
    cfg = evaluator_config(tmp_path, sup, learner, learner__target_return=EPISODE_CAP - 5)
    evaluator = Evaluator(cfg, ctx=ctx)
    thread = start(evaluator.run)
    reference = initial_weights(cfg)
    started_wall = time.time()
    best = cfg.run_dir / "checkpoints" / "best"

    def evaluated(version: int) -> Any:
        return lambda: evaluator.evaluated_version == version

    def waiting_beat() -> bool:  # beats come from a thread: wait for one sent before any evaluation
        return any(hb.state == "waiting" and "evaluations" in hb.counters for hb in sup.drain())

    wait_until(waiting_beat, 20, "a heartbeat from the evaluator waiting for weights")
    learner.publish_until(Weights(1, reference), evaluated(1), 20, "version 1 to be evaluated")
    first = load_checkpoint(best)  # the first evaluation is the best so far
    assert first["contents"] == "weights" and first["version"] == 1 and first["agent_kind"] == "dqn"
    assert all(isinstance(t, torch.Tensor) for t in first["weights"].values())
    learner.publish_until(Weights(2, balancing_weights(reference)), evaluated(2), 20, "version 2")
    assert evaluator.eval_last == EPISODE_CAP and load_checkpoint(best)["version"] == 2
    zeros = {name: np.zeros_like(array) for name, array in reference.items()}  # always pushes left
    learner.publish_until(Weights(3, zeros), evaluated(3), 20, "version 3")
    # Republishing what was evaluated already (the learner does, every second) changes nothing.
    for _ in range(5):
        learner.publisher.publish(Weights(3, zeros))
    learner.sock.send(b"junk: a marker behind the republished weights, counted when it is read")
    after = beats_past_one_more_tick(
        sup, lambda hb: hb.counters.get("bad_messages") == 1, "the evaluator to read the republished weights"
    )
    assert all(hb.state == "running" and hb.counters["evaluations"] == 3 for hb in after), (
        "a version already evaluated was evaluated again"
    )
    sup.stop()
    thread.join(timeout=20)
    assert not thread.is_alive(), "evaluator did not obey the supervisor's stop"

    stats = evaluator.stats
    assert stats["state"] == "stopped" and stats["stop_reason"] == "test says stop"
    assert [r["weights_version"] for r in stats["eval_history"]] == [1, 2, 3]
    assert stats["evaluations"] == 3 and stats["evaluated_version"] == 3
    assert stats["eval_return"] < EPISODE_CAP and stats["eval_best"] == EPISODE_CAP
    assert load_checkpoint(best)["version"] == 2, "a worse version must not replace the best"
    assert stats["target_time"] >= started_wall and stats["target_reached"]["weights_version"] == 2
    written = json.loads((cfg.run_dir / "evaluator-stats.json").read_text())
    assert [r["weights_version"] for r in written["eval_history"]] == [1, 2, 3]
    assert list((cfg.run_dir / "tb" / "evaluator").glob("events.out.tfevents.*"))

    beats = final_beat(sup)
    sup.close()
    learner.close()
    assert {(hb.role, hb.id) for hb in beats} == {("evaluator", 0)}
    final = beats[-1]
    assert final.state == "stopped"
    assert final.counters["evaluations"] == 3 and final.counters["eval_best"] == EPISODE_CAP
    assert final.counters["evaluated_version"] == final.counters["weights_version"] == 3
    assert {"eval_return", "eval_seconds", "target_time"} <= final.counters.keys()
    early = [hb for hb in beats if hb.counters.get("evaluations") == 0]
    assert early and all(
        "target_time" not in hb.counters and "eval_return" not in hb.counters for hb in early
    ), "NaN (not reached yet) is left out"
    progress = [hb.counters["progress"] for hb in beats]
    assert progress == sorted(progress) and progress[-1] > progress[0], "every beat carries progress"

    # The weights-only `best` plays through the same entry point as the learner's checkpoints.
    result = evaluate_checkpoint(best, episodes=3, seed=7)
    assert result.returns == [EPISODE_CAP] * 3 and result.videos == ()


def test_evaluator_waits_out_the_interval_but_scores_the_final_weights_when_the_learner_stops(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    sup, learner = SupervisorDouble(ctx), LearnerDouble(ctx)
    cfg = evaluator_config(tmp_path, sup, learner, evaluator__interval_seconds=60)
    evaluator = Evaluator(cfg, ctx=ctx, logger=NullLogger())
    thread = start(evaluator.run)
    reference = initial_weights(cfg)

    learner.publish_until(Weights(1, reference), lambda: evaluator.evaluated_version == 1, 20, "version 1")
    final = Weights(2, balancing_weights(reference))
    learner.publish_until(final, lambda: evaluator.received_version == 2, 20, "version 2 to arrive")
    holding = beats_past_one_more_tick(
        sup, lambda hb: hb.counters.get("weights_version") == 2, "the evaluator to go on holding version 2"
    )
    assert all(hb.state == "running" and hb.counters["evaluated_version"] == 1 for hb in holding), (
        "evaluated again before evaluator.interval_seconds passed"
    )
    assert evaluator.evaluated_version == 1
    learner.publish_until(None, lambda: not thread.is_alive(), 20, "the evaluator to leave with the learner")

    stats = evaluator.stats
    assert stats["state"] == "stopped" and stats["stop_reason"] == "learner finished"
    assert [r["weights_version"] for r in stats["eval_history"]] == [1, 2]
    assert stats["eval_best"] == EPISODE_CAP and math.isnan(stats["target_time"])  # no target set

    # Restarted into the same run, it must beat the score of the `best` already there.
    again = Evaluator(cfg, ctx=ctx, logger=NullLogger(), resume=True)
    thread = start(again.run)
    learner.publish_until(Weights(3, reference), lambda: again.evaluated_version == 3, 20, "version 3")
    learner.publish_until(None, lambda: not thread.is_alive(), 20, "the evaluator to leave")
    sup.close()
    learner.close()
    assert again.stats["eval_return"] < again.stats["eval_best"] == EPISODE_CAP
    assert load_checkpoint(cfg.run_dir / "checkpoints" / "best")["version"] == 2


def test_under_a_supervisor_a_failed_learner_is_waited_out_and_its_replacement_scored(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    """A learner that fails announces it on the weights channel; the supervisor restarts it, so a
    supervised evaluator stays (a finished learner's announcement alone would end it)."""
    sup, learner = SupervisorDouble(ctx), LearnerDouble(ctx)
    cfg = evaluator_config(tmp_path, sup, learner)
    link = SupervisorLink(ctx, cfg, "evaluator", 0, watch_supervisor=True)
    evaluator = Evaluator(cfg, ctx=ctx, logger=NullLogger(), link=link)
    thread = start(evaluator.run)
    reference = initial_weights(cfg)
    learner.publish_until(Weights(1, reference), lambda: evaluator.evaluated_version == 1, 20, "version 1")
    for _ in range(5):  # PUB/SUB may drop one: the learner announces its end more than once too
        learner.publisher.announce_stop(LEARNER_FAILED)
    learner.sock.send(b"junk: a marker behind the announcements, counted when it is read")
    after = beats_past_one_more_tick(
        sup, lambda hb: hb.counters.get("bad_messages") == 1, "the evaluator to read the announcement"
    )
    assert thread.is_alive() and all(hb.state == "running" for hb in after)
    replacement = Weights(2, balancing_weights(reference))  # the restarted learner's
    learner.publish_until(replacement, lambda: evaluator.evaluated_version == 2, 20, "version 2")
    sup.stop()
    thread.join(timeout=20)
    sup.close()
    learner.close()
    assert not thread.is_alive() and evaluator.stats["stop_reason"] == "test says stop"
    assert [r["weights_version"] for r in evaluator.stats["eval_history"]] == [1, 2]


def test_a_long_evaluation_keeps_heartbeating_and_a_supervisor_stop_abandons_it(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    sup, learner = SupervisorDouble(ctx), LearnerDouble(ctx)
    # Always pushing left, MountainCar's car never reaches the flag: the episode never ends.
    cfg = evaluator_config(
        tmp_path, sup, learner, env__id="MountainCar-v0", env__max_episode_steps=10**9, evaluator__episodes=1
    )
    evaluator = Evaluator(cfg, ctx=ctx, logger=NullLogger())
    thread = start(evaluator.run)
    zeros = {name: np.zeros_like(array) for name, array in initial_weights(cfg).items()}

    def evaluating_beats() -> int:
        return sum(hb.state == "evaluating" for hb in sup.drain())

    learner.publish_until(Weights(1, zeros), lambda: evaluating_beats() >= 3, 20, "heartbeats mid-evaluation")
    sup.stop()
    thread.join(timeout=10)
    assert not thread.is_alive(), "a stop must not wait for the evaluation to finish"
    sup.close()
    learner.close()
    stats = evaluator.stats
    assert stats["state"] == "stopped" and stats["evaluations"] == 0 and stats["eval_history"] == []
    assert not (cfg.run_dir / "checkpoints" / "best").exists()


def test_evaluate_calls_tick_every_step_and_aborts_when_it_says_so(tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, env__max_episode_steps=EPISODE_CAP)
    envs = [make_env(cfg.env, training=False) for _ in range(2)]
    agent = make_eval_agent(cfg, envs[0], seed=0)
    agent.load_weights(balancing_weights(agent.export_weights()))
    ticks = 0

    def tick(abort_after: int | None = None) -> bool:
        nonlocal ticks
        ticks += 1
        return abort_after is not None and ticks > abort_after

    assert evaluate(agent, envs, seed=3, tick=tick) == evaluate(agent, envs, seed=3)
    assert ticks == EPISODE_CAP  # one per lockstep step
    ticks = 0
    with pytest.raises(EvaluationAborted):
        evaluate(agent, envs, seed=3, tick=lambda: tick(abort_after=5))
    assert ticks == 6


def full_state_checkpoint(tmp_path: Path, **extra: object) -> Path:
    """A learner-style checkpoint (the agent's whole state) of a freshly made agent."""
    cfg = tiny_config(tmp_path, **extra)
    env = make_env(cfg.env, training=False)
    agent = make_eval_agent(cfg, env, seed=0)
    env.close()
    path = tmp_path / "latest"
    save_checkpoint(path, {"agent": agent.state_dict(), "config": cfg.to_dict()})
    return path


def test_evaluate_checkpoint_records_every_episode_on_video(tmp_path: Path) -> None:
    pytest.importorskip("moviepy")
    path = full_state_checkpoint(tmp_path, env__id=FRAMED_CARTPOLE, env__max_episode_steps=8)
    video_dir = tmp_path / "videos"
    result = evaluate_checkpoint(path, episodes=2, seed=1, video_dir=video_dir)
    assert len(result.returns) == 2 and max(result.lengths) <= 8
    assert [v.name for v in result.videos] == ["eval-episode-0.mp4", "eval-episode-1.mp4"]
    assert all(v.parent == video_dir and v.stat().st_size > 0 for v in result.videos)
    # Recording plays the episodes one by one, with the seeds of the lockstep evaluation.
    assert result.returns == evaluate_checkpoint(path, episodes=2, seed=1).returns


def test_evaluate_checkpoint_records_cartpole(tmp_path: Path) -> None:
    pytest.importorskip("moviepy")
    pytest.importorskip("pygame", reason="CartPole draws its frames with pygame")
    path = full_state_checkpoint(tmp_path, env__max_episode_steps=5)
    result = evaluate_checkpoint(path, episodes=1, video_dir=tmp_path / "videos")
    assert [v.suffix for v in result.videos] == [".mp4"]


def test_video_without_moviepy_fails_clearly_before_playing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = full_state_checkpoint(tmp_path, env__id=FRAMED_CARTPOLE)
    monkeypatch.setitem(sys.modules, "moviepy", None)  # `import moviepy` now raises ImportError
    video_dir = tmp_path / "videos"
    with pytest.raises(VideoUnavailable, match=r'pip install -e "\.\[video\]"'):
        evaluate_checkpoint(path, episodes=1, video_dir=video_dir)
    assert not video_dir.exists()


@pytest.mark.parametrize("end_heard_from", ["supervisor", "learner"])
def test_an_evaluator_that_heard_no_weights_before_the_run_finished_scores_the_final_checkpoint(
    ctx: zmq.Context, tmp_path: Path, end_heard_from: str
) -> None:
    """A run shorter than the evaluator's start-up still ends with its final policy evaluated: the
    learner's last checkpoint holds exactly the weights it would have published last. The end may
    reach the evaluator as the supervisor's stop or first as the learner's own announcement."""
    sup, learner = SupervisorDouble(ctx), LearnerDouble(ctx)
    cfg = evaluator_config(tmp_path, sup, learner)
    env = make_env(cfg.env, training=False)
    agent = make_eval_agent(cfg, env, seed=0)
    env.close()
    agent.load_weights(balancing_weights(agent.export_weights()))
    save_checkpoint(
        cfg.run_dir / "checkpoints" / LATEST,
        {
            "agent": agent.state_dict(),
            "weights_version": 7,  # as the learner saves what it published last
            "config": cfg.to_dict(),
            "counters": {"samples": 1234},
        },
    )
    evaluator = Evaluator(cfg, ctx=ctx, logger=NullLogger())
    thread = start(evaluator.run)
    wait_until(lambda: any(hb.state == "waiting" for hb in sup.drain()), 20, "the evaluator to wait")
    while thread.is_alive():  # the end of a run; no weights ever came
        if end_heard_from == "supervisor":
            sup.stop("run finished")
        else:
            learner.publisher.announce_stop("learner finished")
        thread.join(timeout=0.1)
    sup.close()
    learner.close()
    stats = evaluator.stats
    assert stats["evaluations"] == 1 and stats["evaluated_version"] >= 7
    assert stats["eval_history"][0]["env_steps"] == 1234
    assert stats["eval_return"] == EPISODE_CAP  # the balancing weights, not a fresh policy's


def test_an_evaluator_of_a_numpy_policy_starts_without_torch() -> None:
    """Importing torch takes an evaluator about a second (on a 2-core machine, a second the learner
    and actors starting beside it lose); a numpy policy's evaluator loads it only to write its best
    checkpoint."""
    script = (
        "import sys\n"
        "from zmqrl.cli import roles\n"
        "from zmqrl.config import load_config\n"
        "from zmqrl.envs.factory import make_env\n"
        "from zmqrl.evaluator.greedy import make_eval_policy\n"
        "from zmqrl.evaluator.main import Evaluator\n"
        "cfg = load_config('configs/cartpole_dqn.yaml')\n"
        "make_eval_policy(cfg, make_env(cfg.env, training=False), seed=0)\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_a_resumed_evaluator_beats_a_readable_best_and_replaces_a_torn_or_foreign_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    best = tmp_path / "best"
    assert stored_best_score(best) is None  # none yet
    save_checkpoint(best, {"contents": "weights", "eval": {"mean": 42.5, "std": 1.0}})
    assert stored_best_score(best) == 42.5
    save_checkpoint(best, {"contents": "weights", "eval": {"mean": math.nan}})
    assert stored_best_score(best) is None  # a NaN score is no score to beat
    best.write_bytes(b"torn by a full disk")
    with caplog.at_level(logging.WARNING, logger="zmqrl.evaluator"):
        assert stored_best_score(best) is None
    assert "it will be replaced by the next evaluation" in caplog.text
