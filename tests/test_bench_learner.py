"""`zmqrl bench`'s learner part: a real trainer, real sender processes, a well-formed result; and
its on-policy rows: synthetic rollouts the learner would accept, APPO's update timed on them."""

from __future__ import annotations

import dataclasses
import multiprocessing as mp

import numpy as np
import pytest

from zmqrl.api import load_config
from zmqrl.spec import SampleSpec
from zmqrl.types import RolloutBatch
from zmqrl_bench import learner
from zmqrl_bench.report import CPU_PER_UPDATES, BenchSettings


@pytest.mark.slow
def test_learner_part_compares_fed_with_idle_training_and_leaves_no_process() -> None:
    settings = BenchSettings(quick=True, repeats=1, seconds=0.2)
    c, cost, with_intake = learner.compare(
        "uniform", [], settings, settings.repeats, learner.TARGET, rate=20_000
    )
    assert c.group == "learner" and c.unit == "updates/s" and c.reference is not None
    assert c.ours.median > 0 and c.reference.median > 0 and c.target == learner.TARGET
    # The samples really arrived: the intake took transitions in while training ran.
    assert c.extra["ingest_transitions_per_s"] > 0 and c.extra["offered_transitions_per_s"] == 20_000
    # What an update cost the training process in CPU, fed against idle: a cost, no target.
    assert cost.unit == CPU_PER_UPDATES and cost.name == "uniform: learner CPU per 1,000 updates"
    assert cost.reference is not None and cost.reference.median > 0 and cost.ours.median > 0
    assert not cost.higher_is_better and cost.target is None and cost.passed is None
    # ... and with the intake process's CPU added: more than the training process's alone.
    assert with_intake.ours.median >= cost.ours.median
    assert mp.active_children() == []


def appo_overrides() -> list[str]:
    """A tiny APPO on the CPU: 4 rollouts of 16 steps per update, one epoch of two minibatches."""
    return [
        "agent.batch_size=64",
        "actor.rollout_length=16",
        "agent.epochs=1",
        "agent.minibatches=2",
        "agent.hidden_sizes=[16]",
        "agent.device=cpu",
        "actor.envs_per_actor=4",  # one message's rows must fit the (smaller) rollout queue
    ]


def check_rollouts(batch: RolloutBatch, spec: SampleSpec, rows: int) -> None:
    """What the learner's checks want of a rollout batch, asserted column by column."""
    steps = spec.rollout_length
    assert steps is not None
    assert batch.rows == rows and batch.length == steps
    assert batch.obs.shape == (rows, steps + 1, *spec.obs_shape) and batch.obs.dtype == spec.obs_dtype
    limits = spec.obs_limits()
    if limits is not None:
        flat = batch.obs.reshape(-1, *spec.obs_shape).reshape(-1, int(np.prod(spec.obs_shape)))
        assert (flat >= limits[0]).all() and (flat <= limits[1]).all()
    assert batch.reward.dtype == np.float32 and np.isfinite(batch.reward).all()
    assert batch.logp.shape == (rows, steps) and batch.logp.dtype == np.float32
    assert np.isfinite(batch.logp).all()
    assert batch.terminated.dtype == np.bool_ and batch.truncated.dtype == np.bool_
    assert not (batch.terminated & batch.truncated).any()
    assert batch.final_obs.shape == (int(batch.truncated.sum()), *spec.obs_shape)


def test_synthetic_rollouts_are_what_the_learner_accepts_discrete_and_continuous() -> None:
    cfg = load_config(learner.APPO_CONFIG, appo_overrides())
    spec = learner.rollout_spec(cfg)
    assert spec.rollout_length == 16 and spec.num_actions == 2
    rng = np.random.default_rng(0)
    batch = learner.rollout_batch(spec, 200, rng)  # 3200 steps: episodes end and are cut in it
    check_rollouts(batch, spec, 200)
    assert batch.action.dtype == np.int64 and set(np.unique(batch.action)) == {0, 1}
    assert batch.terminated.any() and batch.truncated.any()
    assert np.allclose(batch.logp, np.log(0.5))
    box = SampleSpec(
        obs_shape=(3,),
        obs_dtype="float32",
        action_shape=(2,),
        action_dtype="float32",
        action_low=(-2.0, -0.5),
        action_high=(2.0, 0.5),
        obs_low=-1.0,
        obs_high=1.0,
        rollout_length=8,
    )
    batch = learner.rollout_batch(box, 50, rng)
    check_rollouts(batch, box, 50)
    assert batch.action.shape == (50, 8, 2) and batch.action.dtype == np.float32
    assert (np.abs(batch.action[..., 1]) <= 0.5).all() and np.abs(batch.action[..., 1]).max() == 0.5
    frames = SampleSpec(obs_shape=(2, 4, 4), obs_dtype="uint8", action_shape=(), action_dtype="int64")
    frames = dataclasses.replace(frames, num_actions=6, rollout_length=4)
    batch = learner.rollout_batch(frames, 3, rng)
    check_rollouts(batch, frames, 3)
    assert batch.obs.max() > 200 and (batch.action < 6).all()


def test_appo_rows_time_the_agent_update_in_updates_and_env_steps_per_second() -> None:
    settings = BenchSettings(quick=True, repeats=2, seconds=0.05)
    ups, steps, cost = learner.on_policy(learner.APPO_CONFIG, settings, appo_overrides())
    assert (ups.group, ups.unit, steps.unit) == ("learner", "updates/s", "env steps/s")
    assert cost.unit == CPU_PER_UPDATES and not cost.higher_is_better and cost.ours.median > 0
    assert cost.name.startswith("cartpole_appo (APPO, cpu): learner CPU per 1,000 updates")
    assert ups.reference is None and ups.ratio is None and "APPO, cpu" in ups.name
    assert len(ups.ours.values) == 2 and ups.ours.median > 0
    assert steps.ours.values == pytest.approx([u * 64 for u in ups.ours.values])
    assert ups.extra["env_steps_per_update"] == 64 and ups.extra["gradient_steps_per_update"] == 2
    assert "4 rollouts x 16 steps" in ups.notes
    impala = learner.on_policy(learner.APPO_CONFIG, settings, [*appo_overrides(), "agent.clip=null"])
    assert "IMPALA" in impala[0].name
    with pytest.raises(ValueError, match="not on-policy"):
        learner.on_policy(learner.CONFIG, settings)
