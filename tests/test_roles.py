"""Learner and actor wired together in one process (threads over 127.0.0.1), with a test double
standing in for the supervisor: the same objects that run as processes under `zmqrl launch`."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from tests.conftest import tiny_config, wait_until
from zmqrl.actor.main import Actor
from zmqrl.actor.parts import EARLY_BATCHES_MAX, build_acting, early_batches
from zmqrl.agents import make_learner
from zmqrl.config import Config, load_config
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.learner.main import Learner
from zmqrl.runtime.link import SupervisorLink
from zmqrl.runtime.run_fingerprint import run_fingerprint
from zmqrl.supervisor.liveness import FINAL_STATES
from zmqrl.transport import wire
from zmqrl.transport.channels import LearnerUnreachable
from zmqrl.transport.wire import HeartbeatMsg, SamplesMsg, StopMsg, WeightsMsg
from zmqrl.types import EpisodeStat, TransitionBatch, Weights


class FakeSupervisor:
    """Binds the heartbeat and control sockets like the real supervisor; records heartbeats."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.pull = ctx.socket(zmq.PULL)
        self.pull.bind("tcp://127.0.0.1:0")
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:0")
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

    def drain_until_final(self, *roles: str, timeout: float = 10.0) -> list[HeartbeatMsg]:
        """Every heartbeat, once each of ``roles`` has sent its last one (the final state it
        reports as it leaves, which may still be in flight when its thread has ended)."""

        def ended() -> bool:
            done = {hb.role for hb in self.drain() if hb.state in FINAL_STATES}
            return done >= set(roles)

        wait_until(ended, timeout, f"the final heartbeats of {', '.join(roles)}")
        return self.heartbeats

    def stop(self, reason: str = "test says stop") -> None:
        self.pub.send_multipart(wire.dump(StopMsg(reason)))

    def close(self) -> None:
        self.pull.close(0)
        self.pub.close(0)


class FakeLearner:
    """Binds the samples PULL and weights PUB sockets like the real learner, for actor tests.

    An actor holds its first batch until it has heard the learner's weights: ``greet`` publishes
    what a real learner's first message would tell it (the run fingerprint), with the run's
    initial weights as version 0, which an actor never loads (it keeps acting with its own)."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.pull = ctx.socket(zmq.PULL)
        self.pull.bind("tcp://127.0.0.1:0")
        self.pub = ctx.socket(zmq.PUB)
        self.pub.bind("tcp://127.0.0.1:0")
        self._greeting: list[bytes | memoryview] | None = None

    def greet(self, cfg: Config) -> None:
        if self._greeting is None:
            env = make_env(cfg.env)
            spec = sample_spec(env)
            env.close()
            agent = make_learner(cfg.agent, spec, device="cpu")
            initial = Weights(0, agent.export_weights())
            msg = WeightsMsg(initial, cfg.agent.kind, run_fingerprint(cfg, spec))
            self._greeting = wire.dump(msg)
        self.pub.send_multipart(self._greeting)

    def greet_until(self, cfg: Config, done: Callable[[], object], timeout: float, what: str) -> None:
        """Greet every 50 ms until ``done()`` (PUB/SUB drops what is sent before a subscriber joins)."""
        deadline = time.monotonic() + timeout
        while not done():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            self.greet(cfg)
            self.pull.poll(50)

    def first_sample(self, cfg: Config, timeout: float = 20.0) -> SamplesMsg:
        """The actor's first samples message, greeting it until it comes."""
        self.greet_until(cfg, lambda: self.pull.poll(0), timeout, "the actor's first samples")
        msg = wire.load(self.pull.recv_multipart())
        assert isinstance(msg, SamplesMsg)
        return msg

    def endpoints(self) -> dict[str, str]:
        return {
            "samples": self.pull.getsockopt_string(zmq.LAST_ENDPOINT),
            "weights": self.pub.getsockopt_string(zmq.LAST_ENDPOINT),
        }

    def discard_samples(self) -> None:
        while self.pull.poll(0):
            self.pull.recv_multipart()

    def close(self) -> None:
        self.pull.close(0)
        self.pub.close(0)


def with_transport(cfg: Config, **endpoints: str) -> Config:
    return dataclasses.replace(cfg, transport=dataclasses.replace(cfg.transport, **endpoints))


def start(target: Any) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def cartpole_batch(n: int, reward: float = 1.0) -> TransitionBatch:
    """``n`` transitions a CartPole learner accepts (observations inside the env's bounds)."""
    rng = np.random.default_rng(0)
    return TransitionBatch(
        obs=rng.uniform(-0.4, 0.4, size=(n, 4)).astype(np.float32),
        action=rng.integers(0, 2, size=n).astype(np.int64),
        reward=np.full(n, reward, dtype=np.float32),
        next_obs=rng.uniform(-0.4, 0.4, size=(n, 4)).astype(np.float32),
        discount=np.full(n, 0.97, dtype=np.float32),
    )


def test_learner_and_actor_threads_train_sync_weights_and_stop(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    cfg = with_transport(tiny_config(tmp_path), **sup.endpoints())
    learner = Learner(cfg, ctx=ctx)
    learner_thread = start(learner.run)
    assert learner.ready.wait(30)
    actor = Actor(with_transport(cfg, **learner.endpoints), 0, ctx=ctx)
    actor_thread = start(actor.run)

    learner_thread.join(timeout=90)
    assert not learner_thread.is_alive(), "learner did not finish its updates"
    # No supervisor stop: the learner announces its end on the weights channel and the actor leaves.
    actor_thread.join(timeout=30)
    assert not actor_thread.is_alive(), "actor did not leave when its learner finished"
    beats = sup.drain_until_final("learner", "actor")
    sup.close()
    actor_final = next(hb for hb in reversed(beats) if hb.role == "actor")
    assert actor_final.info["stop_reason"] == "learner finished", "why it left, for the supervisor"

    ls, acs = learner.stats, actor.stats
    assert ls["state"] == "finished" and ls["updates"] == 300
    assert ls["samples"] >= 200 and ls["bad_messages"] == 0
    assert ls["samples"] <= acs["samples"], "learner cannot receive more than the actor sent"
    assert ls["weights_version"] > 2  # initial publish + one per sync_interval
    assert 2 <= acs["weights_version"] <= ls["weights_version"]
    assert acs["state"] == "stopped" and actor.link.stop_reason == "learner finished"
    assert len(ls["eval_history"]) == 2  # at 150 and 300 updates, not repeated at the end
    run_dir = cfg.run_dir
    assert (run_dir / "checkpoints" / "latest").is_file() and (run_dir / "checkpoints" / "best").is_file()
    assert list((run_dir / "tb").glob("events.out.tfevents.*"))
    roles = {(hb.role, hb.id) for hb in sup.heartbeats}
    assert roles == {("learner", 0), ("actor", 0)}
    final_actor = [hb for hb in sup.heartbeats if hb.role == "actor"][-1]
    assert final_actor.state == "stopped" and final_actor.counters["steps"] == acs["steps"]


def test_learner_counts_and_drops_malformed_samples(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    cfg = with_transport(tiny_config(tmp_path, learner__min_replay_size=1000), **sup.endpoints())
    learner = Learner(cfg, ctx=ctx)
    thread = start(learner.run)
    assert learner.ready.wait(30)
    # The valid messages say they were acted with version 1: a stamp above the newest published
    # is refused (no actor can hold it), so send once the learner has published it.
    wait_until(lambda: learner.publisher.version >= 1, 10, "the learner's first publish")
    push = ctx.socket(zmq.PUSH)
    push.connect(learner.endpoints["samples"])

    good = SamplesMsg(
        actor_id=0, seq=0, weights_version=1, batch=cartpole_batch(8), episodes=[EpisodeStat(9, 9)]
    )
    good_frames = [bytes(f) for f in wire.dump(good)]
    nan = cartpole_batch(8, reward=float("nan"))
    wrong_shape = cartpole_batch(8)._replace(
        obs=np.zeros((8, 5), np.float32), next_obs=np.zeros((8, 5), np.float32)
    )
    bad_action = cartpole_batch(8)._replace(action=np.full(8, 7, np.int64))
    malformed: list[list[bytes]] = [
        [b"\x00garbage"],
        [],  # replaced below by an empty-ish message
        good_frames[:-1],  # a frame missing
        [*good_frames[:-1], good_frames[-1][:-1]],  # a lying length
        [bytes(f) for f in wire.dump(StopMsg("not a sample"))],
        [bytes(f) for f in wire.dump(dataclasses.replace(good, batch=nan))],
        [bytes(f) for f in wire.dump(dataclasses.replace(good, batch=wrong_shape))],
        [bytes(f) for f in wire.dump(dataclasses.replace(good, batch=bad_action))],
    ]
    malformed[1] = [b""]
    for frames in malformed:
        push.send_multipart(frames)
    push.send_multipart(good_frames)

    wait_until(lambda: learner.samples == 8 and learner.receiver.bad.count == len(malformed), 10, "ingest")
    assert len(learner.replay) == 8
    stored = learner.replay.sample(64, 0).batch
    assert np.isfinite(stored.reward).all() and set(stored.action.tolist()) <= {0, 1}
    assert thread.is_alive(), "bad input must not stop the learner"
    learner.request_stop()
    thread.join(timeout=30)
    push.close(0)
    sup.close()
    assert learner.stats["state"] == "stopped"
    assert learner.stats["bad_messages"] == len(malformed)


def test_actor_follows_newer_weights_only_and_stamps_samples(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    fake = FakeLearner(ctx)
    pull, pub = fake.pull, fake.pub
    cfg = with_transport(
        tiny_config(
            tmp_path, actor__weights_poll_steps=1, actor__epsilon_decay_steps=64, actor__epsilon=0.25
        ),
        **fake.endpoints(),
        **sup.endpoints(),
    )
    actor = Actor(cfg, 0, ctx=ctx)
    thread = start(actor.run)

    def recv_sample() -> SamplesMsg:
        assert pull.poll(20_000), "actor sent nothing"
        msg = wire.load(pull.recv_multipart())
        assert isinstance(msg, SamplesMsg)
        return msg

    first = fake.first_sample(cfg)
    assert first.actor_id == 0 and first.weights_version == 0  # acting with its own initial weights
    reference = {k: np.zeros_like(v) for k, v in actor.agent.arrays.items()}  # type: ignore[attr-defined]
    newer = Weights(5, {k: np.full_like(v, 0.01) for k, v in reference.items()})
    older = Weights(3, {k: np.zeros_like(v) for k, v in reference.items()})

    def publish(weights: Weights) -> None:
        pub.send_multipart(wire.dump(WeightsMsg(weights, "dqn")))

    def stamped_with(version: int) -> bool:
        publish(newer)
        pub.send_multipart([b"\x81\xa5proto\x63"])  # foreign junk on the weights channel
        return recv_sample().weights_version == version

    wait_until(lambda: stamped_with(5), 20, "actor to adopt version 5")
    publish(older)
    seqs = [recv_sample() for _ in range(5)]
    assert all(m.weights_version == 5 for m in seqs[1:]), "an older version must never be applied"
    assert [m.seq for m in seqs] == sorted(m.seq for m in seqs)
    assert actor.weights_client.version == 5
    np.testing.assert_allclose(actor.agent.arrays[next(iter(reference))], 0.01)
    assert actor.weights.bad.count >= 1
    sup.stop()
    thread.join(timeout=20)
    assert not thread.is_alive()
    fake.close()
    sup.close()
    assert actor.stats["state"] == "stopped" and actor.link.stop_reason == "test says stop"
    assert actor.stats["epsilon"] == 0.25, "epsilon anneals from 1.0 onto the actor's rung of the ladder"


@pytest.mark.parametrize(
    ("supervised", "reason", "stays"),
    [
        (True, "learner failed", True),  # the supervisor restarts the learner: keep feeding it
        (True, "learner stopped", True),  # SIGTERMed from outside: restarted too (issue 23, item 6)
        (True, "learner finished", False),
        (False, "learner failed", False),  # started by hand: nobody will restart it
    ],
)
def test_only_supervised_roles_outlive_a_failed_learner(
    ctx: zmq.Context, tmp_path: Path, supervised: bool, reason: str, stays: bool
) -> None:
    sup = FakeSupervisor(ctx)
    cfg = with_transport(tiny_config(tmp_path), **sup.endpoints())
    link = SupervisorLink(ctx, cfg, "actor", 0, threading.Event(), watch_supervisor=supervised)
    try:
        assert link.outlives(reason) is stays
    finally:
        link.close()
        sup.close()


@pytest.mark.parametrize("envs_per_actor", [1, 2])
def test_a_batch_is_stamped_with_the_version_its_oldest_transition_was_acted_with(
    ctx: zmq.Context, tmp_path: Path, envs_per_actor: int
) -> None:
    """With n = 3, the transition of step s leaves its window at step s + 2. Steps 1-4 are acted with
    the actor's initial weights (version 0): its warm-up share (min_replay_size 1: one batch) is
    collected at step 3, then it holds the next batch until the learner's weights arrive, and acts
    with version 5 from step 5 on. So the batches holding steps 1 to 4 are stamped 0, though all
    are sent while the actor already holds version 5."""
    sup, fake = FakeSupervisor(ctx), FakeLearner(ctx)
    cfg = with_transport(
        tiny_config(
            tmp_path,
            agent__n_step=3,
            actor__send_batch=1,
            actor__weights_poll_steps=1,
            actor__envs_per_actor=envs_per_actor,
            learner__min_replay_size=1,
        ),
        **fake.endpoints(),
        **sup.endpoints(),
    )
    actor = Actor(cfg, 0, ctx=ctx)
    thread = start(actor.run)
    wait_until(lambda: actor.steps == 4 * envs_per_actor, 20, "the warm-up batch and the next to fill")
    reference = {k: np.zeros_like(v) for k, v in actor.agent.arrays.items()}  # type: ignore[attr-defined]
    v5 = wire.dump(WeightsMsg(Weights(5, {k: np.full_like(v, 0.01) for k, v in reference.items()}), "dqn"))

    def loaded() -> bool:
        fake.pub.send_multipart(v5)
        return bool(fake.pull.poll(50))

    wait_until(loaded, 20, "the actor to load version 5 and send its first batch")
    msgs = []
    for _ in range(5):
        assert fake.pull.poll(20_000), "actor sent nothing"
        msg = wire.load(fake.pull.recv_multipart())
        assert isinstance(msg, SamplesMsg)
        msgs.append(msg)
    sup.stop()
    thread.join(timeout=20)
    assert not thread.is_alive()
    fake.close()
    sup.close()
    assert not any(m.episodes for m in msgs), "an episode end in the first steps would change the windows"
    assert [m.batch.size for m in msgs] == [envs_per_actor] * 5  # one transition per sub-env each
    assert actor.weights_client.version == 5
    assert [m.weights_version for m in msgs] == [0, 0, 0, 0, 5], "steps 1-4 were acted with version 0"


def test_an_actor_collects_its_warm_up_share_before_the_learner_is_up_and_sends_it_at_once(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    """The learner starts seconds after its actors (it imports torch): a replay agent's actor keeps
    collecting its share of min_replay_size meanwhile, sends nothing, and delivers all of it, in
    order, once it is heard, scored for prioritized replay when sent (the greeting's weights,
    version 0, are never loaded: under the actor's own)."""
    sup, fake = FakeSupervisor(ctx), FakeLearner(ctx)
    cfg = with_transport(
        tiny_config(
            tmp_path,
            actor__send_batch=4,
            actor__num_actors=2,
            learner__min_replay_size=20,  # 10 per actor: 3 batches of 4
            replay__prioritized=True,
        ),
        **fake.endpoints(),
        **sup.endpoints(),
    )
    assert early_batches(cfg) == 3
    actor = Actor(cfg, 0, ctx=ctx)
    thread = start(actor.run)
    try:
        wait_until(
            lambda: hasattr(actor, "adder") and len(actor.adder.held) == 3, 20, "the actor's warm-up share"
        )
        # The actor's own count, not only what has reached the socket by now.
        assert actor.samples_sent == 0, "nothing may be sent before the learner was heard"
        assert not fake.pull.poll(0), "nothing may be sent before the learner was heard"
        fake.greet_until(cfg, lambda: fake.pull.poll(0), 20, "the actor's first samples")
        msgs = []
        while len(msgs) < 4:
            assert fake.pull.poll(20_000), "the actor sent less than its warm-up share and one more batch"
            msg = wire.load(fake.pull.recv_multipart())
            assert isinstance(msg, SamplesMsg)
            msgs.append(msg)
    finally:
        sup.stop()
        thread.join(timeout=20)
        fake.close()
        sup.close()
    assert not thread.is_alive()
    assert [m.seq for m in msgs] == [0, 1, 2, 3]
    for msg in msgs:
        assert msg.priorities is not None
        expected = actor.agent.initial_priorities(msg.batch)  # type: ignore[attr-defined]
        np.testing.assert_allclose(msg.priorities, expected, rtol=1e-5, atol=1e-6)


def test_how_many_batches_an_actor_collects_before_the_learner_is_heard(tmp_path: Path) -> None:
    cartpole = load_config(Path(__file__).parent.parent / "configs" / "cartpole_dqn.yaml")
    assert early_batches(cartpole) == 8  # 1,000 / 2 actors in batches of 64
    big = load_config(
        Path(__file__).parent.parent / "configs" / "cartpole_dqn.yaml", ["learner.min_replay_size=90000"]
    )
    assert early_batches(big) == EARLY_BATCHES_MAX
    appo = build_acting(load_config(Path(__file__).parent.parent / "configs" / "cartpole_appo.yaml"), 0)
    appo.sampler.close()
    assert appo.adder.hold_limit == 0  # rollouts must be acted with the learner's weights


def test_an_actor_that_never_hears_the_learner_gives_up_after_connect_timeout(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    """A learner that publishes nothing this actor accepts (down, refusing its keys, or a foreign
    one with another network): the held first batch is never sent, and the actor leaves."""
    sup, fake = FakeSupervisor(ctx), FakeLearner(ctx)
    cfg = with_transport(
        tiny_config(tmp_path, transport__connect_timeout=0.5), **fake.endpoints(), **sup.endpoints()
    )
    actor = Actor(cfg, 0, ctx=ctx)
    try:
        with pytest.raises(
            LearnerUnreachable, match=r"no weights received from .*transport\.connect_timeout"
        ):
            actor.run()
        assert not fake.pull.poll(0), "nothing may be sent before the learner was heard"
    finally:
        fake.close()
        sup.close()
    assert actor.stats["state"] == "failed" and actor.stats["samples"] == 0
