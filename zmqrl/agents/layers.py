"""The acting networks as data: one table each, from which both the torch and the numpy network are built.

An actor acts in numpy (no torch in its process) with weights the learner's torch network
exported, so the two must agree on every layer, name and shape. Instead of two definitions kept
in step by hand, each acting network is an :class:`ActingNet`: a torso (the MLP of
``hidden_sizes``, or a convolutional torso of ``zmqrl.agents.torsos``) and named linear heads.
The torch modules build their layers from it (``zmqrl.agents.nets.build_acting``), the numpy
policies take their parameter layout and forward pass from it (:meth:`ActingNet.layout`,
:meth:`ActingNet.forward`); what each algorithm does with its heads (DQN's dueling combination,
SAC's clamped log-std) is a few lines on either side, checked for parity by the tests. No torch here.

A table with ``inputs`` reads a Dict observation's records: its torso is keyed, one encoder per key
and then the MLP (``zmqrl.agents.keyed``, where the rule and the parameter names are written down).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from zmqrl.agents.keyed import Field, encode, encoded_width, encoder_layout, numpy_cheap
from zmqrl.agents.torsos import CONV_TORSOS, conv_features

# The torso value of an MLP (any other is a CONV_TORSOS name).
MLP = "mlp"
# Prefix of the torso's parameters ("torso.0.weight", "torso.convs.0.weight", ...).
TORSO = "torso"
# The MLP torso's activations (ActingNet.activation): ReLU (DQN, SAC) or tanh (APPO).
RELU, TANH = "relu", "tanh"


@dataclass(frozen=True)
class ActingNet:
    """A torso, then one linear layer per head (in this order: the parameters' order too).

    ``torso``: ``"mlp"`` (Linear -> ``activation`` per width of ``hidden``, on flattened float32
    observations) or the name of a convolutional torso (``hidden`` unused). ``heads``: (name,
    width) pairs, each a Linear on the torso's features with no activation. ``free``: (name,
    width) vectors that belong to no layer (APPO's state-independent log-std), the module's own
    parameters, which its state dict lists before any layer's. ``inputs``: the keys of a Dict
    observation's records (``zmqrl.agents.keyed``); then the torso is keyed, its encoders chosen
    by ``torso`` key by key, and the MLP of ``hidden`` reads their features.
    """

    torso: str
    hidden: tuple[int, ...]
    heads: tuple[tuple[str, int], ...]
    activation: str = RELU  # of the MLP torso: RELU or TANH
    free: tuple[tuple[str, int], ...] = ()
    core: int = 0
    inputs: tuple[Field, ...] = ()

    @property
    def numpy_acting(self) -> bool:
        """Whether acting runs this table in numpy (the MLP, and the CNNs whose tables say it is
        cheap) rather than through the torch modules (the Nature CNN: see ``zmqrl.agents.torsos``)."""
        if self.inputs:
            return numpy_cheap(self.inputs, self.torso)
        return self.torso == MLP or CONV_TORSOS[self.torso].numpy_acting

    def torso_width(self, obs_shape: tuple[int, ...]) -> int:
        """Features the torso gives the heads (``obs_shape`` is unused by a keyed table)."""
        if self.inputs:
            return self.hidden[-1] if self.hidden else encoded_width(self.inputs, self.torso)
        if self.torso != MLP:
            return CONV_TORSOS[self.torso].hidden
        return self.hidden[-1] if self.hidden else math.prod(obs_shape)

    def layout(self, obs_shape: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
        """Parameter names and shapes, in order, as the torch module's state dict lists them: the
        names and shapes of the weights the learner exports and an actor loads."""
        layout: dict[str, tuple[int, ...]] = {name: (width,) for name, width in self.free}
        if self.inputs or self.torso == MLP:
            if self.inputs:  # the encoders' parameters (a CNN's per image key), then the MLP's
                layout.update(encoder_layout(TORSO, self.inputs, self.torso))
                width = encoded_width(self.inputs, self.torso)
            else:
                width = math.prod(obs_shape)
            for i, size in enumerate(self.hidden):
                # Each Linear is followed by its activation in the Sequential, hence index 2 * i.
                layout[f"{TORSO}.{2 * i}.weight"] = (size, width)
                layout[f"{TORSO}.{2 * i}.bias"] = (size,)
                width = size
        else:
            layout.update(CONV_TORSOS[self.torso].layout(TORSO, obs_shape))
        width = self.torso_width(obs_shape)
        if self.core:  # torch's LSTMCell: gates i, f, g, o stacked on the first axis
            layout[f"{CORE}.weight_ih"] = (4 * self.core, width)
            layout[f"{CORE}.weight_hh"] = (4 * self.core, self.core)
            layout[f"{CORE}.bias_ih"] = (4 * self.core,)
            layout[f"{CORE}.bias_hh"] = (4 * self.core,)
            width = self.core
        for name, out in self.heads:
            layout[f"{name}.weight"] = (out, width)
            layout[f"{name}.bias"] = (out,)
        return layout

    def forward(self, arrays: Mapping[str, np.ndarray], obs: np.ndarray) -> dict[str, np.ndarray]:
        """Each head's outputs ``(B, width)`` float32 for observations ``(B, *obs_shape)``, in numpy,
        from weights named as :meth:`layout` names them (free vectors are the caller's to use)."""
        return self.heads_of(arrays, self.features(arrays, obs))

    def heads_of(self, arrays: Mapping[str, np.ndarray], x: np.ndarray) -> dict[str, np.ndarray]:
        """Each head's outputs for features ``x`` (the torso's, or the core's ``h``)."""
        return {name: x @ arrays[f"{name}.weight"].T + arrays[f"{name}.bias"] for name, _ in self.heads}

    def features(self, arrays: Mapping[str, np.ndarray], obs: np.ndarray) -> np.ndarray:
        """The torso's features ``(B, torso_width)`` float32 of observations ``(B, *obs_shape)``
        (records ``(B,)`` for a keyed table)."""
        if self.inputs or self.torso == MLP:
            if self.inputs:
                x = encode(arrays, obs, TORSO, self.inputs, self.torso)
            else:
                x = obs.reshape(obs.shape[0], -1).astype(np.float32, copy=False)
            tanh = self.activation == TANH
            for i in range(len(self.hidden)):
                x = x @ arrays[f"{TORSO}.{2 * i}.weight"].T + arrays[f"{TORSO}.{2 * i}.bias"]
                if tanh:
                    np.tanh(x, out=x)
                else:
                    np.maximum(x, 0.0, out=x)
        else:
            x = conv_features(obs, dict(arrays), TORSO, CONV_TORSOS[self.torso])
        return x


# Prefix of the LSTM core's parameters (ActingNet.core).
CORE = "core"


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1.0)  # tanh form: no overflow warning for large |x|


def lstm_step(
    arrays: Mapping[str, np.ndarray], x: np.ndarray, h: np.ndarray, c: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """One step of torch's ``nn.LSTMCell`` in numpy: inputs ``x (B, in)``, state ``h, c (B, H)``
    to the new ``(h, c)``. Gates ``i, f, g, o`` from ``x W_ih^T + b_ih + h W_hh^T + b_hh``;
    ``c' = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h' = sigmoid(o) tanh(c')``.

    So ``|h'| < 1`` and ``|c'| <= |c| + 1``: a state ``k`` steps after a zero one is at most ``k``
    in magnitude (what the wire's bound on a rollout's start state rests on)."""
    gates = x @ arrays[f"{CORE}.weight_ih"].T + arrays[f"{CORE}.bias_ih"]
    gates += h @ arrays[f"{CORE}.weight_hh"].T + arrays[f"{CORE}.bias_hh"]
    i, f, g, o = np.split(gates, 4, axis=1)
    c_new = _sigmoid(f) * c + _sigmoid(i) * np.tanh(g)
    h_new = _sigmoid(o) * np.tanh(c_new)
    return h_new.astype(np.float32, copy=False), c_new.astype(np.float32, copy=False)


def dqn_net(
    torso: str, hidden: Sequence[int], n_actions: int, dueling: bool, inputs: tuple[Field, ...] = ()
) -> ActingNet:
    """DQN's Q-network: a plain ``head``, or dueling ``value`` and ``advantage`` heads
    (``inputs``: a Dict observation's keys, see ``zmqrl.agents.keyed``)."""
    heads = (("value", 1), ("advantage", n_actions)) if dueling else (("head", n_actions),)
    return ActingNet(torso, tuple(hidden), heads, inputs=inputs)


def dueling_q(value: np.ndarray, advantage: np.ndarray) -> np.ndarray:
    """``Q = V + A - mean_a A`` (Wang et al., 2016), as the torch network combines its heads."""
    return value + advantage - advantage.mean(axis=1, keepdims=True)


def sac_policy_net(hidden: Sequence[int], act_dim: int, inputs: tuple[Field, ...] = ()) -> ActingNet:
    """SAC's policy: an MLP torso (on every key flattened, for a Dict observation's ``inputs``),
    then the Gaussian's ``mean`` and ``log_std`` heads."""
    return ActingNet(MLP, tuple(hidden), (("mean", act_dim), ("log_std", act_dim)), inputs=inputs)


# APPO's policy heads: a categorical's ``logits``, or a Gaussian's ``mean`` (and a ``log_std`` head
# or free vector, see appo_policy_net).
LOGITS, MEAN, LOG_STD = "logits", "mean", "log_std"


def appo_policy_net(
    torso: str,
    hidden: Sequence[int],
    n_actions: int | None,
    act_dim: int,
    log_std: str,
    core: int = 0,
    inputs: tuple[Field, ...] = (),
) -> ActingNet:
    """APPO's policy: the ``torso`` (a tanh MLP of ``hidden``, or a CNN of ``zmqrl.agents.torsos``),
    then ``logits`` (Discrete: ``n_actions``) or a Gaussian's ``mean`` with its log-std as a
    ``log_std`` head (``log_std="state"``) or a free ``log_std`` vector (``"param"``).

    tanh rather than ReLU in the MLP: bounded features keep the policy's outputs (and so the
    ratios of its probabilities) from jumping on observations of unusual scale, and tanh is what
    PPO's reference implementations use, where it was measured the better choice (Andrychowicz et
    al., 2021). The CNNs keep their papers' ReLUs (PPO's Atari reference uses the Nature CNN as is).
    """
    free: tuple[tuple[str, int], ...] = ()
    if n_actions is not None:
        heads: tuple[tuple[str, int], ...] = ((LOGITS, n_actions),)
    elif log_std == "state":
        heads = ((MEAN, act_dim), (LOG_STD, act_dim))
    else:
        heads, free = ((MEAN, act_dim),), ((LOG_STD, act_dim),)
    return ActingNet(torso, tuple(hidden), heads, activation=TANH, free=free, core=core, inputs=inputs)


# The value network's one head (V(obs)).
VALUE = "value"


def appo_value_net(policy: ActingNet) -> ActingNet:
    """APPO's value network: the policy's torso (its own parameters, same shapes), one ``value``
    unit. Learner-only, so no numpy policy runs it; a table all the same, so the torch module is
    built by the same code as the policy's. A recurrent policy's value network also reads the
    policy core's output (``zmqrl.agents.appo_rnn.RecurrentValue``): this table is not used for it."""
    return ActingNet(
        policy.torso, policy.hidden, ((VALUE, 1),), activation=policy.activation, inputs=policy.inputs
    )
