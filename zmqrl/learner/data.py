"""What a learner trains from, by the agent's family: replay and its ratio, or the rollout queue.

A replay agent (DQN, SAC) gets the configured replay buffer, the replay-ratio limiter and
``learner.min_replay_size``; an on-policy agent (APPO) a bounded queue of rollouts that is both
drained by every update and the actors' backpressure, waiting for one batch before the first
update. The spec the learner checks incoming messages against differs with it too: a transition's
reward is an n-step sum, a rollout's a single step's, and a rollout message may carry no more rows
than always fit the queue. The trainer and serial mode ask this module, never the family.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, NamedTuple

from zmqrl.agents import is_on_policy, uses_sequences
from zmqrl.config import Config
from zmqrl.core import Replay
from zmqrl.envs.factory import sample_spec
from zmqrl.errors import ConfigError
from zmqrl.learner.ingest import largest_add
from zmqrl.replay import Limiter, make_rate_limiter, make_replay
from zmqrl.replay.rollout_queue import QueueLimiter, RolloutQueue, message_rows, queue_rows
from zmqrl.spec import DEFAULT_MAX_ABS_CORE_CELL, SampleSpec, rollout_message_problem

log = logging.getLogger("zmqrl.learner")


class LearnerData(NamedTuple):
    """The learner's store of samples, the limiter between its ingest and training, and how much
    the store must hold before the first update."""

    replay: Replay
    limiter: Limiter
    min_size: int


def learner_spec(cfg: Config, env: Any) -> SampleSpec:
    """What the learner accepts: the env's spaces and bounds, and the run's value limits. A
    transition's reward is an n-step sum (n_step times the per-step limit) and its discount
    ``gamma ** k`` (k >= 1) or 0; a rollout's reward is one step's, its rows exactly
    ``actor.rollout_length`` steps, and a message at most the rows the queue always has room for."""
    if uses_sequences(cfg.agent):
        return _sequence_spec(cfg, env)
    if not is_on_policy(cfg.agent):
        spec = sample_spec(
            env,
            max_abs_obs=cfg.transport.max_abs_obs,
            max_abs_reward=cfg.transport.max_abs_reward * cfg.agent.n_step,
            max_discount=cfg.agent.gamma,
        )
        if problem := transition_message_problem(spec, cfg.actor.send_batch, cfg.transport.max_message_mb):
            raise ConfigError(problem)
        return spec
    batch_rows, capacity_rows = _queue_rows(cfg)
    spec = sample_spec(
        env,
        max_batch=message_rows(batch_rows, capacity_rows),
        max_abs_obs=cfg.transport.max_abs_obs,
        max_abs_reward=cfg.transport.max_abs_reward,
    )
    length, rows = cfg.actor.rollout_length, cfg.actor.envs_per_actor
    if problem := rollout_message_problem(spec, rows, length, cfg.transport.max_message_mb):
        raise ConfigError(problem)
    if getattr(cfg.agent, "core", "none") == "none":
        return dataclasses.replace(spec, rollout_length=length)
    # A recurrent policy's rows carry their start state; its cell is bounded by the episode limit.
    limit = cfg.env.max_episode_steps or getattr(getattr(env, "spec", None), "max_episode_steps", None)
    return dataclasses.replace(
        spec,
        rollout_length=length,
        core_size=int(getattr(cfg.agent, "core_size")),  # noqa: B009 (a recurrent agent has it)
        max_abs_core_cell=float(limit) if limit else DEFAULT_MAX_ABS_CORE_CELL,
    )


def _sequence_spec(cfg: Config, env: Any) -> SampleSpec:
    """A recurrent replay run's (R2D2): windows of the agent's length and burn-in, one step's
    reward each, a core state whose cell the env's time limit bounds (as recurrent APPO's)."""
    spec = sample_spec(
        env, max_abs_obs=cfg.transport.max_abs_obs, max_abs_reward=cfg.transport.max_abs_reward
    )
    agent: Any = cfg.agent
    limit = cfg.env.max_episode_steps or getattr(getattr(env, "spec", None), "max_episode_steps", None)
    return dataclasses.replace(
        spec,
        sequence_length=agent.burn_in + agent.sequence_length,
        burn_in=agent.burn_in,
        core_size=agent.core_size,
        max_abs_core_cell=float(limit) if limit else DEFAULT_MAX_ABS_CORE_CELL,
    )


def transition_message_problem(spec: SampleSpec, send_batch: int, max_message_mb: int) -> str | None:
    """Why every transitions message of an actor would be refused: it carries at least
    ``actor.send_batch`` rows, more than ``spec.max_batch``, or its two observation frames (obs and
    next_obs) alone are over ``transport.max_message_mb``; None when they can pass."""
    if send_batch > spec.max_batch:
        return (
            f"actor.send_batch {send_batch} is more than the {spec.max_batch} transitions a samples "
            f"message may carry: every one would be dropped; lower actor.send_batch"
        )
    obs_frames = 2 * send_batch * spec.obs_bytes
    if obs_frames <= max_message_mb * 2**20:
        return None
    return (
        f"a samples message of actor.send_batch {send_batch} transitions carries "
        f"{obs_frames / 2**20:.1f} MiB of observations (obs and next_obs), more than "
        f"transport.max_message_mb {max_message_mb}: every one would be dropped; lower "
        f"actor.send_batch or raise transport.max_message_mb"
    )


def make_learner_data(cfg: Config, spec: SampleSpec) -> LearnerData:
    """Replay, ratio limiter and ``learner.min_replay_size`` for a replay agent; the rollout queue,
    its limiter and one batch for an on-policy one."""
    lcfg = cfg.learner
    if spec.rollout_length is None:
        replay = make_replay(
            cfg.replay,
            spec,
            seed=cfg.run.seed,
            log=log,
            max_add_rows=largest_add(spec, cfg.transport.max_message_mb),
        )
        limiter = make_rate_limiter(
            lcfg.samples_per_insert, lcfg.samples_per_insert_tolerance, lcfg.min_replay_size
        )
        return LearnerData(replay, limiter, lcfg.min_replay_size)
    batch_rows, capacity_rows = _queue_rows(cfg)
    queue = RolloutQueue(capacity_rows, batch_rows, spec.rollout_length)
    log.info(
        "on-policy: a queue of %d rollouts of %d steps (%d env steps; batches of %d); no replay",
        capacity_rows,
        spec.rollout_length,
        queue.capacity,
        cfg.agent.batch_size,
    )
    return LearnerData(queue, QueueLimiter(queue), cfg.agent.batch_size)


def checkpointed_config(cfg: Config) -> Config:
    """``cfg`` as the learner's checkpoints see it: an on-policy run's queue is never saved (its
    rollouts are seconds old and were acted by weights the resumed learner has moved on from)."""
    if not is_on_policy(cfg.agent) or not cfg.checkpoint.replay:
        return cfg
    return dataclasses.replace(cfg, checkpoint=dataclasses.replace(cfg.checkpoint, replay=False))


def _queue_rows(cfg: Config) -> tuple[int, int]:
    try:
        return queue_rows(cfg.agent.batch_size, cfg.actor.rollout_length, cfg.learner.queue_steps)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
