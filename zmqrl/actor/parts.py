"""What an actor acts with, built once for the actor process and serial mode alike.

An actor is env(s), the agent's acting side, a weights client (which snapshot is newer), a loop
that steps the env(s) and an adder that makes the steps what the learner trains on: n-step
transitions for a replay agent (``Sampler``, Ape-X exploration and priorities), rollouts for an
on-policy one (``RolloutCollector``), overlapping windows with their core state for a recurrent
replay one (``SequenceCollector``, R2D2). Which is the agent plugin's (``AgentPlugin.on_policy``), and
so is how many batches the adder may hold; the callers drive either the same way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, NamedTuple

from zmqrl.actor.adders import Adder
from zmqrl.actor.nstep_log import NStepLog
from zmqrl.actor.rollouts import RolloutCollector, RolloutLog
from zmqrl.actor.sampler import Sampler, actor_seed
from zmqrl.actor.sequences import SequenceCollector, SequenceLog, message_rows
from zmqrl.agents import is_on_policy, make_policy, make_priorities, uses_sequences
from zmqrl.config import Config
from zmqrl.core import Policy, SamplingPolicy
from zmqrl.envs.factory import make_env, make_vector_env, sample_spec
from zmqrl.spec import SampleSpec
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.weights_channel import WeightsClient

# Most batches a replay agent's actor collects before the learner is heard from (see early_batches).
EARLY_BATCHES_MAX = 64


class ActingParts(NamedTuple):
    policy: Policy
    spec: SampleSpec  # the actor's own view of the spaces (its run fingerprint is built from it)
    weights: WeightsClient
    sampler: (
        Sampler | RolloutCollector | SequenceCollector
    )  # each has collect / counters / close / steps / describe
    adder: (
        Adder[NStepLog] | Adder[RolloutLog] | Adder[SequenceLog]
    )  # the steps as messages, held until the learner is heard


def early_batches(cfg: Config) -> int:
    """How many batches a replay agent's actor may collect before the learner (which starts seconds
    after its actors: torch's import) is heard from: its share of ``learner.min_replay_size``, so
    the learner can train as soon as it has published; at most EARLY_BATCHES_MAX."""
    share = cfg.learner.min_replay_size / max(1, cfg.actor.num_actors)
    return min(EARLY_BATCHES_MAX, math.ceil(share / cfg.actor.send_batch))


def build_acting(
    cfg: Config, actor_id: int, *, replacement: bool = False, bad_weights: BadMessages | None = None
) -> ActingParts:
    """Env(s), policy, weights client, sampling loop and adder of actor ``actor_id``. ``replacement``:
    joins a run under way (a replay agent's explorer starts at its rung at once).
    ``bad_weights``: where snapshots the policy refuses are counted (None: a tally of its own)."""
    seed = actor_seed(cfg, actor_id)
    if uses_sequences(cfg.agent):
        return _sequence_parts(cfg, actor_id, seed, replacement, bad_weights)
    if is_on_policy(cfg.agent):
        envs = [make_env(cfg.env) for _ in range(cfg.actor.envs_per_actor)]  # each reset by the collector
        spec = sample_spec(envs[0])
        policy = make_policy(cfg.agent, spec, seed=seed)
        if not isinstance(policy, SamplingPolicy):
            raise TypeError(
                f"agent {cfg.agent.kind!r} is on-policy, but its acting side {type(policy).__name__} has "
                "no sample(obs) -> (actions, logp) (zmqrl.core.SamplingPolicy)"
            )
        client = WeightsClient(policy, bad_weights)
        # None held: rollouts must be acted with the learner's weights.
        rollouts = Adder(actor_id, RolloutLog(spec, len(envs), cfg.actor.rollout_length))
        collector = RolloutCollector(cfg, policy, envs, spec, weights=client, adder=rollouts, seed=seed)
        return ActingParts(policy, spec, client, collector, rollouts)
    num_envs = cfg.actor.envs_per_actor
    env: Any = make_env(cfg.env) if num_envs == 1 else make_vector_env(cfg.env, num_envs, training=True)
    spec = sample_spec(env)
    policy = make_policy(cfg.agent, spec, seed=seed)
    client = WeightsClient(policy, bad_weights)
    n, gamma = cfg.agent.n_step, cfg.agent.gamma
    transitions = Adder(
        actor_id,
        NStepLog(num_envs, n, gamma, cfg.actor.send_batch, spec.obs_np_dtype, spec.action_dtype),
        hold_limit=early_batches(cfg),
        priorities=make_priorities(cfg.agent, policy) if cfg.replay.prioritized else None,
    )
    sampler = Sampler(
        cfg, actor_id, policy, env, spec, weights=client, adder=transitions, replacement=replacement
    )
    return ActingParts(policy, spec, client, sampler, transitions)


def _sequence_parts(
    cfg: Config, actor_id: int, seed: int, replacement: bool, bad_weights: BadMessages | None
) -> ActingParts:
    """A recurrent replay actor (``AgentPlugin.sequences``): plain envs reset by the collector,
    the policy's state per env, windows of ``agent.burn_in + agent.sequence_length`` steps."""
    envs = [make_env(cfg.env) for _ in range(cfg.actor.envs_per_actor)]
    spec = sample_spec(envs[0])
    agent: Any = cfg.agent
    spec = sequence_spec(spec, agent)
    policy = make_policy(cfg.agent, spec, seed=seed)
    client = WeightsClient(policy, bad_weights)
    rows = message_rows(cfg.actor.send_batch, agent.sequence_length)
    log = SequenceLog(spec, len(envs), agent.sequence_length, agent.burn_in, rows)
    adder = Adder(actor_id, log, hold_limit=early_batches(cfg))
    collector = SequenceCollector(
        cfg, actor_id, policy, envs, spec, weights=client, adder=adder, seed=seed, replacement=replacement
    )
    return ActingParts(policy, spec, client, collector, adder)


def sequence_spec(spec: SampleSpec, agent: Any) -> SampleSpec:
    """``spec`` with a sequence agent's window: its length, burn-in and core size."""
    return dataclasses.replace(
        spec,
        sequence_length=agent.burn_in + agent.sequence_length,
        burn_in=agent.burn_in,
        core_size=agent.core_size,
    )
