"""DQN whose TD targets turn NaN once it has made ``POISON_AFTER`` updates: the learner's guard
against non-finite updates, exercised in a real process (``agent.kind:
tests.plugins.poisoned_dqn:PLUGIN``). Its updates from then on are all skipped (a skipped update
does not count, so the agent never gets past the poison), as a network that overflowed would be."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from zmqrl.agents.builtin import check_dqn, dqn_priorities, make_dqn_policy
from zmqrl.agents.configs import DQNConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.registry import AgentPlugin
from zmqrl.agents.updates import Flag, Metrics
from zmqrl.core import LearningAgent
from zmqrl.spec import SampleSpec

# Agent updates (taken steps) before every TD target is NaN.
POISON_AFTER = 40


@dataclass
class PoisonedDQNConfig(DQNConfig):
    kind: str = "poisoned_dqn"  # this plugin's name (or its import path)

    def check(self) -> None:
        """DQN's checks of DQN's fields (its own refuses any kind but 'dqn')."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(DQNConfig)}
        DQNConfig(**{**fields, "kind": "dqn"}).check()


class PoisonedDQN(DQNAgent):
    def _learn(self, x: Mapping[str, torch.Tensor], captured: bool) -> tuple[list[Flag], Metrics]:
        if self.updates >= POISON_AFTER:  # a NaN reward makes every TD target NaN
            x = {**x, "reward": x["reward"] * float("nan")}
        return super()._learn(x, captured)


def make_learner(
    config: PoisonedDQNConfig, spec: SampleSpec, *, seed: int | None, device: str | None
) -> LearningAgent:
    return PoisonedDQN(config, spec, device=device, seed=seed)


PLUGIN = AgentPlugin(
    name="poisoned_dqn",
    config_class=PoisonedDQNConfig,
    make_learner=make_learner,
    make_policy=make_dqn_policy,
    check=check_dqn,
    fingerprint_fields=("kind", "hidden_sizes", "dueling", "torso", "n_step", "gamma"),
    description="test double: DQN whose TD targets turn NaN after a few updates",
    make_priorities=dqn_priorities,
)
