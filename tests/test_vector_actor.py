"""Vector actors (``actor.envs_per_actor`` > 1) and actor-computed initial priorities, over real
sockets against the FakeLearner / FakeSupervisor doubles of test_roles.

A registered marker env makes the actor's output checkable end to end: sub-env j (the j-th instance
made) observes ``[j, t, episode]``, earns ``j + 1`` per step and terminates at ``t == 4 + 3 * j``,
under a time limit of 8 steps, so sub-envs 0 and 1 terminate and sub-env 2 is truncated.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
import pytest
import zmq

from tests.conftest import tiny_config
from tests.nstep_reference import ActedVersions
from tests.test_roles import FakeLearner, FakeSupervisor, start, with_transport
from zmqrl.actor.exploration import EpsilonExplorer, apex_epsilon
from zmqrl.actor.main import Actor
from zmqrl.actor.sampler import ACTOR_SEED_STRIDE
from zmqrl.agents.configs import DQNConfig, SACConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.sac import SACAgent
from zmqrl.config import Config
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import EpisodeStat

MARKER_ID = "ZmqrlTestMarker-v0"
MARKER_TIME_LIMIT = 8


def terminates_at(j: int) -> int:
    return 4 + 3 * j


class MarkerEnv(gym.Env[np.ndarray, np.int64]):
    instances: ClassVar[itertools.count[int]] = itertools.count()
    reset_seeds: ClassVar[dict[int, int | None]] = {}

    observation_space = gym.spaces.Box(-1.0, 1000.0, shape=(3,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, **kwargs: Any) -> None:
        self.index = next(MarkerEnv.instances)
        self.t = 0
        self.episode = -1

    def _obs(self) -> np.ndarray:
        return np.array([self.index, self.t, self.episode], dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        super().reset(seed=seed)
        if seed is not None:
            MarkerEnv.reset_seeds[self.index] = seed
        self.t = 0
        self.episode += 1
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        assert self.action_space.contains(action)
        self.t += 1
        return self._obs(), float(self.index + 1), self.t >= terminates_at(self.index), False, {}


if MARKER_ID not in gym.registry:
    gym.register(MARKER_ID, entry_point=MarkerEnv, max_episode_steps=MARKER_TIME_LIMIT)


def fresh_marker_envs() -> None:
    """Number the next MarkerEnv instances from 0 again (the actor's sub-envs are made in order)."""
    MarkerEnv.instances = itertools.count()
    MarkerEnv.reset_seeds = {}


def actor_config(tmp_path: Path, fake: FakeLearner, sup: FakeSupervisor, **extra: object) -> Config:
    values: dict[str, object] = {"actor__max_steps_per_s": "null", "actor__send_batch": 16}
    values.update(extra)
    return with_transport(tiny_config(tmp_path, **values), **fake.endpoints(), **sup.endpoints())


def collect(
    fake: FakeLearner,
    actor: Actor,
    thread: Any,
    cfg: Config,
    spec: SampleSpec,
    *,
    wanted: int | None = None,
    timeout: float = 20.0,
) -> list[SamplesMsg]:
    """Samples messages, each checked as the learner would (greeting the actor until its first
    one: it sends nothing before it heard the learner), until the actor thread has ended and
    ``wanted`` of them arrived; by default every batch the actor counted as sent, so the last
    ones, still in flight when the thread ends, are waited for rather than hoped for."""
    msgs: list[SamplesMsg] = []

    def receive() -> None:
        msg = wire.load(fake.pull.recv_multipart())
        assert isinstance(msg, SamplesMsg)
        wire.validate_samples(msg, spec)
        msgs.append(msg)

    def enough() -> bool:
        if thread.is_alive():
            return False
        return len(msgs) >= (int(actor.stats["batches"]) if wanted is None else wanted)

    deadline = time.monotonic() + timeout
    while not enough():
        sent = "? (still running)" if thread.is_alive() else actor.stats["batches"]
        assert time.monotonic() < deadline, f"{len(msgs)} batches of {sent} received"
        if not msgs:
            fake.greet(cfg)
        if fake.pull.poll(50):
            receive()
    while fake.pull.poll(0):  # and whatever else has arrived, without waiting for it
        receive()
    return msgs


def test_vector_actor_keeps_sub_envs_apart(ctx: zmq.Context, tmp_path: Path) -> None:
    fake, sup = FakeLearner(ctx), FakeSupervisor(ctx)
    n, gamma = 3, 0.5
    cfg = actor_config(
        tmp_path,
        fake,
        sup,
        env__id=MARKER_ID,
        agent__n_step=n,
        agent__gamma=gamma,
        actor__envs_per_actor=3,
        actor__num_actors=2,
        actor__max_steps=300,
    )
    spec = sample_spec(make_env(cfg.env))
    fake.greet(cfg)  # builds its greeting now: that makes an env, which must not renumber the actor's
    fresh_marker_envs()
    actor = Actor(cfg, 1, ctx=ctx)
    thread = start(actor.run)
    msgs = collect(fake, actor, thread, cfg, spec)
    fake.close()
    sup.close()

    stats = actor.stats
    assert stats["state"] == "finished" and stats["envs"] == 3  # it reached actor.max_steps
    assert 300 <= stats["steps"] < 303, "steps count real transitions; may overshoot by < E"
    assert [m.seq for m in msgs] == list(range(len(msgs))) and len(msgs) >= 10
    assert sum(m.batch.size for m in msgs) == stats["samples"] <= stats["steps"]
    seed = cfg.run.seed + ACTOR_SEED_STRIDE * 2
    assert MarkerEnv.reset_seeds == {0: seed, 1: seed + 1, 2: seed + 2}
    rungs = [apex_epsilon(3 + j, 6, cfg.actor.epsilon, cfg.actor.epsilon_alpha) for j in range(3)]
    np.testing.assert_allclose(actor.sampler.epsilons, rungs)
    assert stats["epsilon"] == pytest.approx(np.mean(rungs))

    seen = set()
    for msg in msgs:
        b = msg.batch
        for obs, action, reward, next_obs, discount in zip(
            b.obs, b.action, b.reward, b.next_obs, b.discount, strict=True
        ):
            j, t, episode = (int(v) for v in obs)
            seen.add(j)
            assert (int(next_obs[0]), int(next_obs[2])) == (j, episode), "window mixed sub-envs or episodes"
            k = int(next_obs[1]) - t
            assert 1 <= k <= n and action in (0, 1)
            assert reward == pytest.approx((j + 1) * sum(gamma**i for i in range(k)))
            ended_here = int(next_obs[1]) == min(terminates_at(j), MARKER_TIME_LIMIT)
            assert k == n or ended_here, "short windows only at an episode's end"
            terminated = ended_here and terminates_at(j) <= MARKER_TIME_LIMIT
            assert discount == pytest.approx(0.0 if terminated else gamma**k)
    assert seen == {0, 1, 2}
    episodes = [ep for m in msgs for ep in m.episodes]
    assert {EpisodeStat(*ep) for ep in episodes} == {
        EpisodeStat(4.0, 4),
        EpisodeStat(14.0, 7),
        EpisodeStat(24.0, 8),
    }
    assert stats["episodes"] >= len(episodes)


def test_vector_actor_warm_up_anneals_each_rung(ctx: zmq.Context, tmp_path: Path) -> None:
    fake, sup = FakeLearner(ctx), FakeSupervisor(ctx)
    cfg = actor_config(
        tmp_path, fake, sup, actor__envs_per_actor=2, actor__epsilon_decay_steps=100, actor__max_steps=1000
    )
    actor = Actor(cfg, 0, ctx=ctx)
    thread = start(actor.run)
    collect(fake, actor, thread, cfg, sample_spec(make_env(cfg.env)), wanted=0)
    fake.close()
    sup.close()
    # Each sub-env anneals over its own transitions (~500 each here), so all sit on their rungs.
    rungs = actor.sampler.epsilons
    assert actor.stats["epsilon"] == pytest.approx(float(np.mean(rungs)))
    np.testing.assert_allclose(actor.sampler.sub_env_epsilons(np.array([0, 50])), [1.0, (1 + rungs[1]) / 2])


def test_vector_actor_stops_on_supervisor_broadcast(ctx: zmq.Context, tmp_path: Path) -> None:
    fake, sup = FakeLearner(ctx), FakeSupervisor(ctx)
    cfg = actor_config(tmp_path, fake, sup, actor__envs_per_actor=4, actor__max_steps_per_s=2000)
    actor = Actor(cfg, 0, ctx=ctx)
    thread = start(actor.run)
    fake.first_sample(cfg)
    sup.stop()
    thread.join(timeout=20)
    assert not thread.is_alive()
    fake.close()
    sup.close()
    assert actor.stats["state"] == "stopped" and actor.link.stop_reason == "test says stop"
    assert actor.stats["steps"] > 0 and actor.stats["envs"] == 4


@pytest.mark.parametrize(("envs_per_actor", "prioritized"), [(1, True), (3, True), (3, False), (1, False)])
def test_dqn_actor_sends_initial_priorities_only_for_prioritized_replay(
    ctx: zmq.Context, tmp_path: Path, envs_per_actor: int, prioritized: bool
) -> None:
    fake, sup = FakeLearner(ctx), FakeSupervisor(ctx)
    cfg = actor_config(
        tmp_path,
        fake,
        sup,
        actor__envs_per_actor=envs_per_actor,
        actor__max_steps=200,
        replay__prioritized=prioritized,
    )
    actor = Actor(cfg, 0, ctx=ctx)
    thread = start(actor.run)
    msgs = collect(fake, actor, thread, cfg, sample_spec(make_env(cfg.env)), wanted=5)
    fake.close()
    sup.close()
    assert len(msgs) >= 5
    if not prioritized:
        assert all(m.priorities is None for m in msgs)
        assert actor.stats["priority_seconds"] == 0.0
        return
    assert actor.stats["priority_seconds"] > 0.0
    for msg in msgs:
        p = msg.priorities
        assert p is not None and p.dtype == np.float32 and p.shape == (msg.batch.size,)
        assert np.isfinite(p).all() and (p >= 0).all()
        # No weights were published, so the actor's copy still holds the weights it scored with.
        expected = actor.agent.initial_priorities(msg.batch)  # type: ignore[attr-defined]
        assert expected is not None
        np.testing.assert_allclose(p, expected, rtol=1e-5, atol=1e-6)


def test_sac_vector_actor_sends_no_priorities_and_bounded_actions(ctx: zmq.Context, tmp_path: Path) -> None:
    """SAC actors hold no critic: initial_priorities is None, so batches go without (and the
    continuous random rows come from the action space, inside its bounds)."""
    fake, sup = FakeLearner(ctx), FakeSupervisor(ctx)
    cfg = actor_config(
        tmp_path,
        fake,
        sup,
        env__id="Pendulum-v1",
        agent__kind="sac",
        agent__hidden_sizes="[16, 16]",
        agent__n_step=1,
        actor__envs_per_actor=2,
        actor__max_steps=200,
        replay__prioritized=True,
    )
    actor = Actor(cfg, 0, ctx=ctx)
    thread = start(actor.run)
    msgs = collect(fake, actor, thread, cfg, sample_spec(make_env(cfg.env)), wanted=5)
    fake.close()
    sup.close()
    assert actor.stats["state"] == "finished" and len(msgs) >= 5
    assert all(m.priorities is None for m in msgs)
    actions = np.concatenate([m.batch.action for m in msgs])
    assert actions.shape[1:] == (1,) and (np.abs(actions) <= 2.0).all()


def test_per_row_epsilon_mixes_random_actions_into_dqn_rows() -> None:
    spec = SampleSpec((3,), "float32", (), "int64", num_actions=5)
    agent = DQNAgent(DQNConfig(hidden_sizes=[8], device="cpu"), spec, seed=0)
    obs = np.zeros((3, 3), np.float32)
    greedy = int(agent.act(obs[:1], explore=False)[0])
    # One epsilon per row, as a vector actor's sub-envs.
    explorer = EpsilonExplorer(agent, spec, seed=0, epsilon=np.array([0.0, 1.0, 0.5]))
    rows = np.stack([explorer.act(obs) for _ in range(2000)])
    assert rows.dtype == np.int64 and (rows[:, 0] == greedy).all(), "epsilon 0: always the agent's action"
    assert set(rows[:, 1].tolist()) == set(range(5)) and abs((rows[:, 1] == greedy).mean() - 0.2) < 0.05
    assert abs((rows[:, 2] != greedy).mean() - 0.5 * 0.8) < 0.05
    explorer.epsilon = np.ones(3)
    agent._online_arrays = None  # would be needed only if the network were evaluated
    agent.online = None  # type: ignore[assignment]
    assert explorer.act(obs).shape == (3,), "when every row explores, the network is not called"


def test_per_row_epsilon_gives_uniform_actions_in_bounds_for_sac() -> None:
    spec = SampleSpec((3,), "float32", (2,), "float32", action_low=-2.0, action_high=2.0)
    agent = SACAgent(SACConfig(hidden_sizes=[8], device="cpu"), spec, seed=0)
    obs = np.zeros((2, 3), np.float32)
    explorer = EpsilonExplorer(agent, spec, seed=0, epsilon=np.array([0.0, 1.0]))
    rows = np.stack([explorer.act(obs) for _ in range(200)])
    assert rows.dtype == np.float32 and rows.shape == (200, 2, 2)
    assert (np.abs(rows) <= 2.0).all() and rows[:, 1].std() > 0.5  # uniform over [-2, 2]


def test_acted_versions_follow_each_sub_envs_window_and_skip_autoreset_rows() -> None:
    """The version each window step was acted with leaves with it: the oldest among the emitted
    steps is the one a batch is stamped with (n = 2 here; sub-env 1's episode ends at step 2)."""
    acted = ActedVersions(2)
    assert acted.step(1, fed=[True, True], pending_after=[1, 1]) is None  # windows filling
    assert acted.step(2, fed=[True, True], pending_after=[1, 0]) == 1  # env 0 emits step 1; env 1 ends
    assert acted.step(3, fed=[True, False], pending_after=[1, 0]) == 2  # env 1 in its autoreset step
    assert acted.step(4, fed=[True, True], pending_after=[0, 1]) == 3  # env 0 ends: steps acted with 3, 4
    assert acted.step(5, fed=[False, True], pending_after=[0, 1]) == 4  # env 1 emits its step at v4
