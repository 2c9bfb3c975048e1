"""An on-policy actor's rollouts: fixed length, real steps only, truncations with their observation."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from zmqrl.actor.adders import Adder
from zmqrl.actor.rollouts import RolloutCollector, RolloutLog
from zmqrl.actor.sampler import Collected
from zmqrl.config import load_config
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.transport.weights_channel import WeightsClient
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import RolloutBatch, Weights


class CoinPolicy:
    """Uniformly random CartPole actions, each with log-probability log(1/2)."""

    def __init__(self) -> None:
        self.rng = np.random.default_rng(0)
        self.loaded = 0

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        return self.sample(obs)[0]

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        actions = self.rng.integers(0, 2, size=len(obs)).astype(np.int64)
        return actions, np.full(len(obs), np.log(0.5), np.float32)

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        self.loaded += 1


def collector(envs: int, length: int, max_episode_steps: int) -> tuple[RolloutCollector, WeightsClient]:
    cfg = load_config(
        None,
        [
            "agent.kind=appo",
            f"actor.envs_per_actor={envs}",
            f"actor.rollout_length={length}",
            f"env.max_episode_steps={max_episode_steps}",
            "actor.weights_poll_steps=1000000",
        ],
    )
    env_list = [make_env(cfg.env) for _ in range(envs)]
    policy = CoinPolicy()
    client = WeightsClient(policy)
    spec = sample_spec(env_list[0])
    adder = Adder(0, RolloutLog(spec, envs, length))
    return RolloutCollector(cfg, policy, env_list, spec, weights=client, adder=adder, seed=7), client


def message(c: RolloutCollector) -> SamplesMsg:
    msg = c.adder.pop()
    assert msg is not None, "collect() said BATCH_READY"
    return msg


def next_message(c: RolloutCollector) -> RolloutBatch:
    while (collected := c.collect(1 << 20)) is not Collected.BATCH_READY:
        assert collected is Collected.WEIGHTS_DUE
    batch = message(c).batch
    assert isinstance(batch, RolloutBatch)
    return batch


def test_rollouts_have_one_row_per_env_of_fixed_length_and_bootstrap_observations() -> None:
    c, _ = collector(envs=3, length=8, max_episode_steps=5)  # every episode is cut at 5 steps
    first = next_message(c)
    assert first.obs.shape == (3, 9, 4) and first.reward.shape == (3, 8) and first.action.shape == (3, 8)
    assert c.steps == 24
    second = next_message(c)
    # Rollouts continue where the last one ended: its bootstrap observation is the next's first.
    np.testing.assert_array_equal(second.obs[:, 0], first.obs[:, 8])
    for batch in (first, second):
        assert not (batch.terminated & batch.truncated).any()
        assert batch.final_obs.shape == (int(batch.truncated.sum()), 4)
        assert (batch.logp == np.float32(np.log(0.5))).all()
        # After a done step the row goes on with a new episode; a cut episode's last observation is
        # kept in final_obs (row-major order), and it is not the reset observation that follows.
        for k, (r, t) in enumerate(zip(*np.nonzero(batch.truncated), strict=True)):
            assert not np.array_equal(batch.final_obs[k], batch.obs[r, t + 1])
    assert c.adder.episode_counters()["episodes"] >= 3 and c.counters(1.0)["rollouts"] == 6


def test_a_rollout_is_stamped_with_the_version_its_first_step_acted_with_and_weights_come_between() -> None:
    c, client = collector(envs=1, length=4, max_episode_steps=500)
    assert c.collect(1 << 20) is Collected.WEIGHTS_DUE  # before the first step
    client.offer(Weights(3, {}))
    assert c.collect(1 << 20) is Collected.BATCH_READY
    assert message(c).weights_version == 3
    # Every new rollout starts by asking for newer weights.
    assert c.collect(1 << 20) is Collected.WEIGHTS_DUE
    client.offer(Weights(5, {}))
    assert c.collect(2) is Collected.BUDGET_SPENT  # half a rollout: nothing to send yet
    client.offer(Weights(6, {}))  # a newer version mid-rollout is used, but the stamp stays the oldest
    assert c.collect(1 << 20) is Collected.BATCH_READY
    msg = message(c)
    assert msg.weights_version == 5 and msg.seq == 1
