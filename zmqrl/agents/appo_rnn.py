"""Recurrent APPO's learner side (``agent.core: lstm``): the unroll of the policy's LSTM over a
batch of rollouts, and the value unit on the same core.

Each rollout row starts from the core state its actor acted with at its first step
(``RolloutBatch.core_state``); the unroll steps the torch ``nn.LSTMCell`` (the layout the numpy
policy runs, ``zmqrl.agents.layers.lstm_step``) over the row's ``T`` steps and its bootstrap
observation, and zeroes the state after every terminated or truncated step, as the actor did:
the next step is a new episode's first. A truncated step's bootstrap observation (``final_obs``)
is stepped from the state *before* that reset (it continues the episode that was cut).

The value network has a torso of its own on the observation and reads the policy core's ``h``
without gradient: the rollout carries one state, the policy's (a value network with a memory of
its own would need its own state on the wire), and the value loss does not reach the policy's
layers, as the feed-forward agent's separate value network does not. (A value unit on the shared
core learned far slower on CartPole: its loss dominated the clipped gradient.) With the MLP torso
that is a tanh MLP on the observation and ``h`` together; with a CNN torso (MinAtar's, the Nature
one) it is the same CNN as the policy's (its own parameters: flattened frames are no MLP input,
28,224 values for the Nature CNN's), whose features meet ``h`` at the value unit. Epochs over the
same rollouts unroll again from the same start states.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch
from torch import nn

from zmqrl.agents.keyed import Field, encoded_width
from zmqrl.agents.keyed_nets import KeyedTorso
from zmqrl.agents.layers import MLP, VALUE
from zmqrl.agents.nets import init_linear_, torso_features
from zmqrl.agents.torsos import CONV_TORSOS

if TYPE_CHECKING:
    from zmqrl.agents.appo_nets import APPOPolicyNet


class Rollouts(Protocol):
    """The columns of ``zmqrl.agents.appo_batch.Rollouts`` an unroll reads (that module imports
    this one)."""

    @property
    def obs(self) -> torch.Tensor: ...
    @property
    def actions(self) -> torch.Tensor: ...
    @property
    def terminated(self) -> torch.Tensor: ...
    @property
    def truncated(self) -> torch.Tensor: ...
    @property
    def final_obs(self) -> torch.Tensor: ...
    @property
    def core_state(self) -> torch.Tensor: ...
    @property
    def final_step(self) -> torch.Tensor: ...


class Unrolled(NamedTuple):
    """The core over a batch of rows."""

    h: torch.Tensor  # (R, T + 1, H): the core's output at every observation (T: the bootstrap)
    before_reset: tuple[torch.Tensor, torch.Tensor]  # h, c (R, T, H) after each step, not reset


def unroll(policy: APPOPolicyNet, obs: torch.Tensor, state: torch.Tensor, done: torch.Tensor) -> Unrolled:
    """The policy's core over observations ``(R, T + 1, *obs_shape)`` from ``state`` ``(R, 2, H)``,
    the state zeroed after each step where ``done`` ``(R, T)`` (terminated or truncated)."""
    rows, length = obs.shape[:2]
    x = policy.features(obs.flatten(0, 1)).reshape(rows, length, -1)
    h, c = state[:, 0], state[:, 1]
    keep = (~done).to(x.dtype).unsqueeze(-1)
    outs, hs, cs = [], [], []
    for t in range(length):
        h, c = policy.cell(x[:, t], (h, c))
        outs.append(h)
        if t < length - 1:
            hs.append(h)
            cs.append(c)
            h, c = h * keep[:, t], c * keep[:, t]
    return Unrolled(torch.stack(outs, 1), (torch.stack(hs, 1), torch.stack(cs, 1)))


class RecurrentValue(nn.Module):
    """``(obs, h) -> V`` ``(B,)`` (learner-only). Torso ``mlp``: a tanh MLP of ``hidden`` on the
    flattened observation and the policy core's ``h`` (detached), then one ``value`` unit. A CNN
    torso (``zmqrl.agents.torsos``): that CNN on the observation, then one ``value`` unit on its
    features and ``h`` (``hidden`` unused, as the feed-forward CNN value network does not use it)."""

    torso: nn.Module

    def __init__(
        self,
        obs_shape: tuple[int, ...],
        size: int,
        hidden: list[int],
        generator: torch.Generator | None = None,
        torso: str = MLP,
        inputs: tuple[Field, ...] = (),
    ) -> None:
        super().__init__()
        self.kind = torso
        self.encoder: KeyedTorso | None = None
        if (
            inputs
        ):  # a Dict observation: each key's encoder (no MLP of its own), then the tanh MLP on [them, h]
            self.encoder = KeyedTorso(inputs, torso, (), nn.Tanh, generator)
            self.torso, width = _tanh_mlp(encoded_width(inputs, torso) + size, hidden)
        elif torso == MLP:
            self.torso, width = _tanh_mlp(math.prod(obs_shape) + size, hidden)
        else:
            from zmqrl.agents.conv import CONV_NETS  # only pixel runs pay for (and need) the conv module

            self.torso = CONV_NETS[torso](obs_shape, generator=generator)  # drawn from generator
            width = CONV_TORSOS[torso].hidden + size
        setattr(self, VALUE, nn.Linear(width, 1))
        if generator is not None:
            if self.encoder is not None:  # the encoders drew their own; the MLP and the unit here
                init_linear_(self.torso, generator)
                init_linear_(getattr(self, VALUE), generator)
            else:
                init_linear_(self if torso == MLP else getattr(self, VALUE), generator)

    def forward(self, obs: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        if self.encoder is not None:
            x = self.torso(torch.cat([self.encoder(obs), h.detach()], dim=1))
        elif self.kind == MLP:
            x = self.torso(torch.cat([obs.reshape(obs.shape[0], -1).to(torch.float32), h.detach()], dim=1))
        else:
            x = torch.cat([torso_features(self.torso, self.kind, obs), h.detach()], dim=1)
        return getattr(self, VALUE)(x).squeeze(-1)


class Outputs(NamedTuple):
    """What an update needs of the networks for a batch of rows."""

    row_values: torch.Tensor  # (R, T + 1)
    final_values: torch.Tensor  # (K,) values of final_obs (K: its rows, padded ones included)
    logp: torch.Tensor  # (R * T,)
    entropy: torch.Tensor  # (R * T,)


def recurrent_outputs(
    policy: APPOPolicyNet,
    value: RecurrentValue,
    data: Rollouts,
    picked: torch.Tensor | slice = slice(None),
    finals: bool = True,
) -> Outputs:
    """Values, log-probabilities and entropies of the rows ``picked`` (all by default), each row
    unrolled from its start state; the values of ``final_obs`` when ``finals`` (those rows belong
    to the whole batch: only with every row picked)."""
    obs, actions = data.obs[picked], data.actions[picked]
    rows, steps = actions.shape[:2]
    done = data.terminated[picked] | data.truncated[picked]
    run = unroll(policy, obs, data.core_state[picked], done)
    row_values = value(obs.flatten(0, 1), run.h.flatten(0, 1)).reshape(rows, steps + 1)
    # A masked policy's logits at each step obey that step's own row (the heads read h).
    logp, entropy = policy.head_log_prob_entropy(
        run.h[:, :steps].flatten(0, 1), actions.flatten(0, 1), obs[:, :steps].flatten(0, 1)
    )
    final_values = row_values.new_zeros(0)
    if finals and data.final_obs.shape[0]:
        # Each final_obs row continues its episode: one step from the state its truncated step left.
        flat = data.final_step
        h = run.before_reset[0].flatten(0, 1)[flat]
        c = run.before_reset[1].flatten(0, 1)[flat]
        h_final, _ = policy.cell(policy.features(data.final_obs), (h, c))
        final_values = value(data.final_obs, h_final)
    return Outputs(row_values, final_values, logp, entropy)


def _tanh_mlp(width: int, hidden: list[int]) -> tuple[nn.Sequential, int]:
    """Linear -> tanh per width of ``hidden`` from ``width`` inputs, and its output width."""
    layers: list[nn.Module] = []
    for out in hidden:
        layers += [nn.Linear(width, out), nn.Tanh()]
        width = out
    return nn.Sequential(*layers), width
