"""R2D2's acting side in numpy: greedy Q-values of a torso (``agent.torso``: the MLP or a CNN), an
LSTM core and a linear head, with one core state per env carried across calls (actors and the
evaluator; no torch in their processes). With the Nature CNN, whose convolutions numpy runs many
times slower, actors act with ``R2D2Agent`` on the CPU instead (``zmqrl.agents.builtin``, as DQN's
and APPO's do).

The table is :func:`r2d2_net`, from which the learner's torch network is built too, so the weights
it publishes load here name for name; the LSTM step is ``zmqrl.agents.layers.lstm_step`` (torch's
``nn.LSTMCell`` layout), the one recurrent APPO's numpy policy runs. Exploration is the actor's
(epsilon-random rows around ``act``): the state advances on every call, random rows included, so
it always follows the episode the env played. A masked run's Q-values obey the legal actions of
the row each step acts on (``zmqrl.agents.masks``; the head reads the core's ``h``, the legal
actions are the row's).
"""

from __future__ import annotations

import numpy as np

from zmqrl.agents.appo_policy import CoreActing, CoreState
from zmqrl.agents.keyed import obs_fields, torso_problem
from zmqrl.agents.layers import ActingNet, lstm_step
from zmqrl.agents.masks import mask_numpy
from zmqrl.agents.numpy_policies import LoadedArrays, NamedArrays
from zmqrl.agents.r2d2_config import R2D2Config
from zmqrl.spec import SampleSpec

# The Q head's name in the table (and in the published weights).
Q_HEAD = "head"


def r2d2_net(config: R2D2Config, spec: SampleSpec) -> ActingNet:
    """The recurrent Q-network's table for this config and spec: the torso, an LSTM of
    ``core_size``, the Q head; ValueError for what ``check_r2d2`` refuses (continuous actions,
    frames a CNN torso cannot take).

    The torso is ``agent.torso``: the ReLU MLP of ``hidden_sizes``, or a CNN whose features the
    LSTM reads directly (``hidden_sizes`` unused), as the heads of DQN's and APPO's CNN tables read
    them. On a Dict observation each key goes through its encoder (the CNN for image keys) and the
    MLP of ``hidden_sizes`` mixes them all before the LSTM (``zmqrl.agents.keyed``)."""
    if spec.num_actions is None:
        raise ValueError("R2D2 needs a Discrete action space (spec.num_actions)")
    if problem := torso_problem(config.torso, spec):
        raise ValueError(problem)
    heads = ((Q_HEAD, spec.num_actions),)
    hidden = tuple(config.hidden_sizes)
    return ActingNet(config.torso, hidden, heads, core=config.core_size, inputs=obs_fields(spec))


def q_step(
    net: ActingNet, arrays: dict[str, np.ndarray], obs: np.ndarray, core: CoreState, masked: bool = False
) -> np.ndarray:
    """Q-values ``(B, A)`` of observations ``(B, *obs_shape)``, one LSTM step from ``core``'s
    state, which it leaves advanced (``masked``: each row's illegal actions MASKED_VALUE)."""
    state = core.rows(len(obs))
    h, c = lstm_step(arrays, net.features(arrays, obs), state[:, 0], state[:, 1])
    state[:, 0], state[:, 1] = h, c
    q = net.heads_of(arrays, h)[Q_HEAD]
    return mask_numpy(q, obs) if masked else q


class NumpyR2D2Policy(CoreActing, LoadedArrays):
    """Greedy acting on the recurrent Q-network (``act``; ``explore`` changes nothing: the actor
    replaces rows with random actions), with ``zmqrl.core.RecurrentPolicy``'s state methods."""

    def __init__(self, config: R2D2Config, spec: SampleSpec, *, seed: int | None = None) -> None:
        config.check()
        self.config = config
        self.masked = spec.action_mask  # greedy over each row's legal actions only
        self.net = r2d2_net(config, spec)
        self._params = NamedArrays(self.net.layout(tuple(spec.obs_shape)), seed)
        self._core = CoreState(config.core_size)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Q-values ``(B, A)`` float32; the state advances one step."""
        assert self._core is not None
        return q_step(self.net, self._params.arrays, obs, self._core, self.masked)

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Greedy int64 actions ``(B,)``; the state advances one step."""
        return self.q_values(obs).argmax(axis=1).astype(np.int64, copy=False)
