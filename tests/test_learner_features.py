"""Learner behaviour added for Ape-X-style runs: prioritized replay fed by actor priorities, the
replay-ratio limiter (both directions, and recovery), the policy-lag cut-off, and the memory check.

A real Learner runs in a thread over 127.0.0.1; the tests play the actors by hand with a PUSH
socket, so they control exactly what arrives and when."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zmq

from tests.conftest import tiny_config, tiny_overrides, wait_until
from tests.test_exit_codes import error_lines, role_args
from tests.test_exit_codes import run as run_cli
from tests.test_launch import REPO
from tests.test_roles import FakeSupervisor, cartpole_batch, with_transport
from zmqrl.actor.main import Actor
from zmqrl.config import Config
from zmqrl.envs.factory import EnvError
from zmqrl.errors import ConfigError
from zmqrl.learner.main import Learner
from zmqrl.learner.trainer import check_weights_fit
from zmqrl.replay import NoLimit, PrioritizedReplay, RateLimiter, replay_footprint
from zmqrl.replay.memory import ReplayMemoryError
from zmqrl.spec import SampleSpec
from zmqrl.transport import sockets, wire
from zmqrl.transport.keys import Security, create_keys
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import EpisodeStat


class RecordingLogger:
    """A Logger double that keeps every scalar, so tests can check what reaches TensorBoard."""

    def __init__(self) -> None:
        self.scalars: dict[str, list[float]] = {}

    def scalar(self, tag: str, value: float, step: int) -> None:
        self.scalars.setdefault(tag, []).append(float(value))

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class Running:
    """A learner thread plus a hand-driven actor socket; stops and joins on exit."""

    def __init__(self, ctx: zmq.Context, cfg: Config) -> None:
        self.sup = FakeSupervisor(ctx)
        self.cfg = with_transport(cfg, **self.sup.endpoints())
        self.logger = RecordingLogger()
        self.learner = Learner(self.cfg, ctx=ctx, logger=self.logger)
        self.thread = threading.Thread(target=self.learner.run, daemon=True)
        self.thread.start()
        assert self.learner.ready.wait(30)
        self.push = ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.SNDHWM, 4)
        self.push.connect(self.learner.endpoints["samples"])
        self.seq = 0

    def send(
        self,
        n: int = 32,
        version: int | None = None,
        priorities: np.ndarray | None = None,
        episodes: list[EpisodeStat] | None = None,
    ) -> None:
        msg = SamplesMsg(
            actor_id=0,
            seq=self.seq,
            weights_version=self.learner.publisher.version if version is None else version,
            batch=cartpole_batch(n),
            episodes=episodes or [],
            priorities=priorities,
        )
        self.push.send_multipart(wire.dump(msg))
        self.seq += 1

    def try_send(self, n: int = 32) -> bool:
        """Send unless the learner's queue (and ours) is full: False means backpressure."""
        if not self.push.poll(0, zmq.POLLOUT):
            return False
        self.send(n)
        return True

    def stop(self) -> dict[str, object]:
        self.learner.request_stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive()
        self.push.close(0)
        self.sup.close()
        return self.learner.stats


def test_prioritized_learner_trains_and_refreshes_priorities(ctx: zmq.Context, tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path, replay__prioritized=True, learner__min_replay_size=64, learner__max_updates=10**6
    )
    run = Running(ctx, cfg)
    high = np.full(32, 50.0, np.float32)
    run.send(priorities=high)
    run.send()  # no priorities: the running maximum
    wait_until(lambda: run.learner.updates > 200, 30, "updates on prioritized replay")
    replay = run.learner.replay
    assert isinstance(replay, PrioritizedReplay)
    stats = run.stop()
    assert stats["samples"] == 64 and stats["bad_messages"] == 0
    # Both batches started at priority 50 (the sent one, and the running max for the other); every
    # row has since been sampled and re-prioritized with its TD error, which is far smaller here.
    stored = replay.priorities_of(np.arange(64))
    assert np.all(stored < 50.0**cfg.replay.alpha / 2), stored


def test_real_actor_sends_priorities_that_the_learner_accepts(ctx: zmq.Context, tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, replay__prioritized=True)
    sup = FakeSupervisor(ctx)
    cfg = with_transport(cfg, **sup.endpoints())
    learner = Learner(cfg, ctx=ctx)
    lt = threading.Thread(target=learner.run, daemon=True)
    lt.start()
    assert learner.ready.wait(30)
    actor = Actor(with_transport(cfg, **learner.endpoints), 0, ctx=ctx)
    at = threading.Thread(target=actor.run, daemon=True)
    at.start()
    lt.join(timeout=90)
    at.join(timeout=30)
    sup.close()
    assert not lt.is_alive() and not at.is_alive()
    assert learner.stats["state"] == "finished" and learner.stats["bad_messages"] == 0
    assert learner.stats["updates"] == cfg.learner.max_updates


def test_stale_batches_are_dropped_and_counted(ctx: zmq.Context, tmp_path: Path) -> None:
    cfg = tiny_config(
        tmp_path,
        learner__max_policy_lag=3,
        # Versions far apart enough (~5 ms) that a current batch, taken into replay a few
        # milliseconds after it was sent (the learner takes its intake's groups between updates),
        # is still within the lag.
        learner__sync_interval=5,
        learner__min_replay_size=32,
        learner__max_updates=10**6,
    )
    run = Running(ctx, cfg)
    run.send()
    wait_until(lambda: run.learner.publisher.version > 10, 30, "several published versions")
    before = len(run.learner.replay)
    for _ in range(5):
        run.send(version=1)  # acted by weights far older than max_policy_lag versions
    run.send()  # current: kept
    wait_until(lambda: run.learner.stale_batches == 5 and run.learner.samples == 64, 10, "ingest")
    assert len(run.learner.replay) == before + 32
    wait_until(lambda: run.learner.updates > 3 * cfg.learner.log_interval, 30, "a few log points")
    stats = run.stop()
    assert stats["stale_batches"] == 5 and stats["stale_samples"] == 160
    tb = run.logger.scalars
    assert max(tb["learner/policy_lag_max"]) > 3 and min(tb["learner/policy_lag_min"]) <= 1
    assert "learner/policy_lag_mean" in tb and max(tb["learner/stale_batches"]) == 5


def count_refusals(monkeypatch: pytest.MonkeyPatch, limiter: RateLimiter | NoLimit) -> list[int]:
    """A list that grows by one each time the learner's ``await_sample`` says no (it then does its
    housekeeping and asks again): the training loop's own count of the waits it went through."""
    refusals: list[int] = []
    admit = limiter.await_sample

    def counted(n: int, timeout: float) -> bool:
        admitted = admit(n, timeout)
        if not admitted:
            refusals.append(n)
        return admitted

    monkeypatch.setattr(limiter, "await_sample", counted)
    return refusals


def test_learner_waits_for_data_under_the_replay_ratio_and_resumes(
    ctx: zmq.Context, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # 32 per batch, 2 sampled per inserted, 64 rows of tolerance: 256 rows allow about 20 updates.
    cfg = tiny_config(
        tmp_path,
        learner__samples_per_insert=2.0,
        learner__samples_per_insert_tolerance=64,
        learner__min_replay_size=64,
        learner__max_updates=10**6,
        learner__log_interval=5,
    )
    run = Running(ctx, cfg)
    limiter = run.learner.limiter
    refusals = count_refusals(monkeypatch, limiter)
    for _ in range(8):
        run.send()

    def out_of_data() -> bool:
        blocked = limiter.stats["sample_blocked_seconds"] > 0.3
        return run.learner.samples == 256 and not limiter.can_sample(32) and blocked

    def refused_twice_more() -> Callable[[], bool]:
        seen = len(refusals)
        return lambda: len(refusals) >= seen + 2

    wait_until(out_of_data, 20, "the learner to wait")
    # Each refusal comes from a call the training loop made after its previous update was counted;
    # the second one from now was asked after all the data was in: the count is final.
    wait_until(refused_twice_more(), 10, "the learner to wait for data that will not come")
    paused_at = run.learner.updates
    assert 0 < paused_at * 32 <= (256 + 64) * 2 + 32
    wait_until(refused_twice_more(), 10, "the learner to go round its wait twice more")
    assert run.learner.updates == paused_at, "no updates while the actors are paused"
    for _ in range(8):  # actors resume
        run.send()
    wait_until(lambda: run.learner.updates > paused_at + 10, 20, "training to resume")
    stats = run.stop()
    tb = run.logger.scalars
    assert max(tb["perf/sample_blocked_seconds"]) > 0.3 and "replay/samples_per_insert" in tb
    ratio = float(stats["samples_per_insert"])  # type: ignore[arg-type]
    assert 1.0 < ratio <= 2.0 + 64 * 2 / 512 + 0.2
    assert float(stats["sample_blocked_seconds"]) > 0.3  # type: ignore[arg-type]


def test_max_seconds_ends_a_run_whose_replay_never_fills(
    ctx: zmq.Context, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``learner.max_seconds`` bounds the whole run, its wait for replay included: actors that never
    fill replay (crashing, or too few) no longer keep a time-boxed run (a tuning trial) alive."""
    cfg = tiny_config(tmp_path, learner__max_seconds=4.0, learner__min_replay_size=200)
    run = Running(ctx, cfg)
    for i in range(2):  # 64 of the 200 transitions the first update waits for
        run.send(32, episodes=[EpisodeStat(10.0 + i, 10)])
    wait_until(lambda: run.learner.samples == 64, 4, "both messages in replay, well before the limit")
    wait_until(lambda: not run.thread.is_alive(), 30, "the learner to end at max_seconds by itself")
    stats = run.stop()
    assert (stats["state"], stats["ended"], stats["updates"]) == ("finished", "max_seconds", 0)
    assert stats["samples"] == 64
    assert "replay holds 64 of the 200 transitions" in caplog.text
    # No log point came (no update): the episodes reach the curves at the run's end.
    assert run.logger.scalars["charts/episodic_return"] == [10.0, 11.0]


def test_actors_are_held_back_when_the_learner_falls_behind(ctx: zmq.Context, tmp_path: Path) -> None:
    # 1000 sampled per inserted: the learner cannot keep up, so it stops reading the socket.
    cfg = tiny_config(
        tmp_path,
        learner__samples_per_insert=1000.0,
        learner__samples_per_insert_tolerance=64,
        learner__min_replay_size=64,
        learner__max_updates=10**6,
        transport__samples_hwm=4,
    )
    run = Running(ctx, cfg)
    limiter = run.learner.limiter

    def held_back() -> bool:
        """Send as fast as the sockets take it (in bursts of at most 0.5 s, so the check below runs
        often). Queues (ZeroMQ's and the kernel's TCP buffers) absorb a few MB; then the sender must
        find itself blocked *because* the learner's ingest waits on the limiter: the backpressure."""
        burst_until = time.monotonic() + 0.5
        while time.monotonic() < burst_until and run.try_send():
            pass
        sender_blocked = not run.push.poll(0, zmq.POLLOUT)
        ingest_waits = not limiter.can_insert(32) and limiter.stats["insert_blocked_seconds"] > 0.5
        return sender_blocked and ingest_waits

    try:
        wait_until(held_back, 20, "the sender to be held back by a learner waiting on the limiter")
        limits = limiter.stats
        allowed = 64 + limits["sampled"] / 1000 + 64 + 32  # min size + what was learned from + tolerance
        assert limits["inserted"] <= allowed, "replay must not run ahead of the ratio's tolerance"
    finally:
        stats = run.stop()
    assert stats["state"] == "stopped"


def test_replay_larger_than_memory_is_refused_before_anything_binds(ctx: zmq.Context, tmp_path: Path) -> None:
    cfg = tiny_config(tmp_path, replay__capacity=10**12, learner__min_replay_size=10)
    learner = Learner(cfg, ctx=ctx)
    with pytest.raises(ReplayMemoryError, match=r"replay.capacity"):
        learner.run()
    assert not learner.ready.is_set()


def test_replay_footprint_counts_both_observations_and_priorities() -> None:
    spec = SampleSpec(
        obs_shape=(4, 84, 84), obs_dtype="uint8", action_shape=(), action_dtype="int64", num_actions=6
    )
    row = 2 * 4 * 84 * 84 + 8 + 4 + 4
    assert replay_footprint(1000, spec, prioritized=False) == 1000 * row
    assert replay_footprint(1000, spec, prioritized=True) > 1000 * row


def test_learner_command_refuses_oversized_replay_with_exit_code_2(tmp_path: Path) -> None:
    cfg_args = [f"--set={item}" for item in tiny_overrides(tmp_path, replay__capacity=10**12)]
    result = subprocess.run(
        [sys.executable, "-m", "zmqrl", "learner", str(REPO / "configs" / "cartpole_dqn.yaml"), *cfg_args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "replay.capacity" in result.stderr and "Traceback" not in result.stderr


def test_shared_frames_on_vector_observations_is_a_clear_error(ctx: zmq.Context, tmp_path: Path) -> None:
    learner = Learner(tiny_config(tmp_path, replay__share_frames=True), ctx=ctx)
    with pytest.raises(EnvError, match=r"replay\.share_frames"):
        learner.run()


# ---------------------------------------------------------------------------------------------
# Weights that subscribers would drop are refused at start (issue 9, item 8)
# ---------------------------------------------------------------------------------------------

BIG_NETWORK = {"agent__hidden_sizes": "[1024, 1024]", "transport__max_message_mb": 1}  # a 4 MiB layer


def test_weights_larger_than_max_message_mb_are_refused_before_anything_binds(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    learner = Learner(tiny_config(tmp_path, **BIG_NETWORK), ctx=ctx)
    with pytest.raises(ConfigError) as info:
        learner.run()
    message = str(info.value)
    assert "weights message (4.0 MiB)" in message and "transport.max_message_mb 1 (1.0 MiB)" in message
    assert "raise transport.max_message_mb to 5" in message
    assert not learner.ready.is_set()


def test_the_suggested_max_message_mb_is_enough(ctx: zmq.Context, tmp_path: Path) -> None:
    """The limit holds over a whole message (header included): a 4 MiB array needs 5, which the
    message names, and a message just under 4 MiB passes."""
    check_weights_fit({"w": ((1023, 1024), "float32")}, "dqn", {}, 4)
    with pytest.raises(ConfigError, match="to 5"):
        check_weights_fit({"w": ((1024, 1024), "float32")}, "dqn", {}, 4)
    check_weights_fit({"w": ((1024, 1024), "float32")}, "dqn", {}, 5)


def test_learner_command_refuses_weights_over_max_message_mb_with_one_line(tmp_path: Path) -> None:
    big = ("agent.hidden_sizes=[1024, 1024]", "transport.max_message_mb=1")
    result = run_cli([sys.executable, "-m", "zmqrl", *role_args(tmp_path, "learner", *big)])
    assert result.returncode == 2, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "transport.max_message_mb 1" in lines[0] and "to 5" in lines[0]
    assert "Traceback" not in result.stderr


def test_a_network_of_more_tensors_than_a_weights_message_carries_is_a_config_error(tmp_path: Path) -> None:
    """Issue 23 item 11: 40 hidden layers make 82 tensors, more than the wire format's 64 arrays a
    message; the learner died of a WireError traceback from the encoder. Now: exit 2, one line
    naming the cause and the setting."""
    deep = "agent.hidden_sizes=[" + ", ".join(["8"] * 40) + "]"
    result = run_cli([sys.executable, "-m", "zmqrl", *role_args(tmp_path, "learner", deep)])
    assert result.returncode == 2, result.stderr
    lines = error_lines(result.stderr)
    assert len(lines) == 1 and "82 tensors, more than the 64" in lines[0], result.stderr
    assert "agent.hidden_sizes" in lines[0] and "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# What the learner reports about its feeds: seq accounting, clipped priorities, refused peers
# ---------------------------------------------------------------------------------------------


def test_lost_reordered_and_restarted_batches_reach_stats_and_tensorboard(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    cfg = tiny_config(
        tmp_path, learner__min_replay_size=32, learner__max_updates=10**6, learner__log_interval=5
    )
    run = Running(ctx, cfg)
    for seq in (0, 1, 4, 3, 0):  # two lost (2, 3), 3 arrives late, then the actor restarts
        run.seq = seq
        run.send()
    wait_until(lambda: run.learner.batches == 5, 10, "ingest")

    def accounted() -> tuple[int, int, int]:  # as the intake process last reported them
        counters = run.learner._counters()
        return counters["lost_batches"], counters["reordered_batches"], counters["actor_restarts"]

    wait_until(lambda: accounted() == (2, 1, 1), 10, "the intake's sequence accounting")
    wait_until(lambda: run.logger.scalars.get("learner/actor_restarts", [0])[-1] == 1, 30, "a log point")
    counters = run.learner._counters()
    assert counters["untracked_batches"] == 0
    stats = run.stop()
    assert stats["per_actor"] == {
        0: {"batches": 5, "samples": 160, "lost": 2, "reordered": 1, "restarts": 1, "last_seq": 0}
    }
    tb = run.logger.scalars
    assert tb["learner/lost_batches"][-1] == 2 and tb["learner/reordered_batches"][-1] == 1
    assert tb["learner/actor_restarts"][-1] == 1
    assert "replay/clipped_priorities" not in tb and "clipped_priorities" not in stats  # uniform replay
    written = json.loads((cfg.run_dir / "learner-stats.json").read_text())
    assert written["per_actor"]["0"]["lost"] == 2


def test_hostile_priorities_are_clipped_by_the_configured_ratio_and_counted(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    cfg = tiny_config(
        tmp_path,
        replay__prioritized=True,
        replay__max_initial_priority_ratio=2.0,
        learner__min_replay_size=64,
        learner__max_updates=10**6,
        learner__log_interval=5,
    )
    run = Running(ctx, cfg)
    replay = run.learner.replay
    assert isinstance(replay, PrioritizedReplay) and replay.max_initial_priority_ratio == 2.0
    run.send(priorities=np.full(32, 3e38, np.float32))  # one actor claims every row is urgent
    run.send()
    wait_until(lambda: run.learner.samples == 64, 10, "ingest")
    wait_until(lambda: "replay/clipped_priorities" in run.logger.scalars, 30, "a log point")
    stats = run.stop()
    assert stats["clipped_priorities"] == 32
    assert run.logger.scalars["replay/clipped_priorities"][-1] == 32


def test_refused_curve_handshakes_are_counted_in_the_learners_stats(ctx: zmq.Context, tmp_path: Path) -> None:
    keys_dir = tmp_path / "keys"
    create_keys(keys_dir)
    cfg = tiny_config(
        tmp_path,
        transport__keys_dir=str(keys_dir),
        transport__key_name="learner",  # the supervisor takes learner heartbeats from this key only
        learner__min_replay_size=64,
    )
    sup = FakeSupervisor(ctx)
    learner = Learner(with_transport(cfg, **sup.endpoints()), ctx=ctx, logger=RecordingLogger())
    thread = threading.Thread(target=learner.run, daemon=True)
    thread.start()
    assert learner.ready.wait(30)
    own = Security.load(keys_dir)
    public, secret = zmq.curve_keypair()  # knows the server key, but was never authorized
    stranger = dataclasses.replace(own, server_secret=None, client_public=public, client_secret=secret)
    push = sockets.samples_push(ctx, learner.endpoints["samples"], sockets.SocketLimits(), security=stranger)
    wait_until(lambda: learner._counters().get("auth_denied", 0) >= 1, 10, "the refused handshake")
    learner.request_stop()
    thread.join(timeout=30)
    push.close(0)
    sup.close()
    assert learner.stats["state"] == "stopped" and learner.stats["auth_denied"] >= 1
    assert learner.stats["samples"] == 0
