"""APPO's acting side in numpy: a categorical or Gaussian policy whose actions come with their
log-probabilities, for actors and evaluators (no torch in their processes).

The network is the table ``zmqrl.agents.layers.appo_policy_net``, the same one ``APPOAgent``
builds its torch policy from, so the weights it exports load here name for name. The sampling
rule is written once, here: ``APPOAgent`` acts through these functions too (on numpy views of its
parameters on a CPU, on its torch outputs on a GPU), so with the same seed and weights both draw
the same actions with the same log-probabilities.

Continuous actions (the agreed semantics of the on-policy family): a diagonal Gaussian in the
env's own action units; the action sent is the sample clipped to the spec's finite bounds, and its
log-probability is the Gaussian log-density at that clipped action, as the learner evaluates it,
so that the first ratio of fresh data is 1. Greedy play is the clipped mean (argmax of the logits
for Discrete actions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from zmqrl.agents.configs import APPOConfig
from zmqrl.agents.layers import LOG_STD, LOGITS, MEAN, ActingNet, appo_policy_net
from zmqrl.agents.numpy_policies import LoadedArrays, NamedArrays
from zmqrl.spec import SampleSpec

# Bounds of the Gaussian's log standard deviation (those of APPOConfig.log_std_init): below -20 the
# density at the mean overflows float32's log-probabilities' useful range; above 2 the policy is
# noise on any normalised action scale.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# The output heads start this many times smaller than torch's default draw (and unbiased): the
# first policy is then close to uniform (Discrete) or centred at 0 with std exp(log_std_init),
# whatever the random torso, as PPO's reference implementations start (a 0.01-gain head).
HEAD_INIT_SCALE = 0.01


def appo_net(config: APPOConfig, spec: SampleSpec) -> ActingNet:
    """The policy's table for this config and spec, after checking what ``check_appo`` checks
    (flat observations; Discrete actions or a 1-D Box); ValueError otherwise."""
    if len(spec.obs_shape) != 1:
        raise ValueError(f"APPO needs flat observations, got obs_shape {tuple(spec.obs_shape)}")
    if spec.num_actions is not None:
        return appo_policy_net(config.hidden_sizes, spec.num_actions, 0, config.log_std)
    if len(spec.action_shape) != 1 or spec.action_shape[0] < 1:
        raise ValueError(f"APPO needs Discrete actions or a 1-D Box, got action_shape {spec.action_shape}")
    return appo_policy_net(config.hidden_sizes, None, spec.action_shape[0], config.log_std)


def action_bounds(spec: SampleSpec) -> tuple[np.ndarray, np.ndarray]:
    """The spec's continuous action bounds as float32 ``(act_dim,)`` arrays; none, or infinite
    ones, are +-inf, which clipping leaves alone."""
    act_dim = math.prod(spec.action_shape)
    low = -np.inf if spec.action_low is None else spec.action_low
    high = np.inf if spec.action_high is None else spec.action_high
    return (
        np.broadcast_to(np.asarray(low, np.float32), (act_dim,)).copy(),
        np.broadcast_to(np.asarray(high, np.float32), (act_dim,)).copy(),
    )


def shape_initial_policy(arrays: Mapping[str, np.ndarray], net: ActingNet, log_std_init: float) -> None:
    """Scale freshly drawn policy weights in place (numpy arrays, or views of torch parameters):
    the output heads by ``HEAD_INIT_SCALE`` with zero biases, the log-std (head bias or free
    vector) to ``log_std_init``."""
    for name, _ in net.heads:
        arrays[f"{name}.weight"][...] *= HEAD_INIT_SCALE
        arrays[f"{name}.bias"][...] = log_std_init if name == LOG_STD else 0.0
    for name, _ in net.free:
        arrays[name][...] = log_std_init


def policy_heads(
    net: ActingNet, arrays: Mapping[str, np.ndarray], obs: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """The policy's outputs for observations ``(B, *obs_shape)``: ``(logits, None)`` for Discrete
    actions, ``(mean, log_std)`` (``log_std`` clamped, broadcast to ``(B, act_dim)``) for a Box."""
    heads = net.forward(arrays, obs)
    if LOGITS in heads:
        return heads[LOGITS], None
    mean = heads[MEAN]
    log_std = heads[LOG_STD] if LOG_STD in heads else np.broadcast_to(arrays[LOG_STD], mean.shape)
    return mean, np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise ``log softmax`` in float32, shifted by the row's max so no exp overflows."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def gaussian_logp(mean: np.ndarray, log_std: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """Diagonal Gaussian log-density ``(B,)`` float32 of ``actions`` ``(B, act_dim)``, as the
    learner's ``appo_nets.gaussian_logp`` computes it."""
    z = (actions - mean) / np.exp(log_std)
    return (-0.5 * z * z - log_std - np.float32(HALF_LOG_2PI)).sum(axis=1, dtype=np.float32)


class APPOActions:
    """The acting rule on the policy's outputs, shared by ``NumpyAPPOPolicy`` and ``APPOAgent``
    (same draws from the same generator, in the same order)."""

    def __init__(self, spec: SampleSpec) -> None:
        self.discrete = spec.num_actions is not None
        bounds = (np.zeros(0, np.float32), np.zeros(0, np.float32)) if self.discrete else action_bounds(spec)
        self.low: np.ndarray = bounds[0]
        self.high: np.ndarray = bounds[1]

    def sample(
        self, rng: np.random.Generator, out: np.ndarray, log_std: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Actions drawn from the policy and their log-probabilities ``(B,)`` float32: int64 ``(B,)``
        by inverse CDF over the softmax of ``out`` (logits), or float32 ``(B, act_dim)`` samples of
        ``N(out, exp(log_std))`` clipped to the bounds, with the density at the clipped action."""
        if log_std is None:
            log_probs = log_softmax(out)
            cdf = np.cumsum(np.exp(log_probs, dtype=np.float64), axis=1)
            draws = rng.random((len(out), 1))
            # The last action takes whatever rounding left of the cdf beyond its final entry.
            actions = np.minimum((draws >= cdf).sum(axis=1), out.shape[1] - 1).astype(np.int64)
            return actions, log_probs[np.arange(out.shape[0]), actions].astype(np.float32, copy=False)
        noise = rng.standard_normal(out.shape, dtype=np.float32)
        actions = np.clip(out + np.exp(log_std) * noise, self.low, self.high).astype(np.float32, copy=False)
        return actions, gaussian_logp(out, log_std, actions)

    def greedy(self, out: np.ndarray, log_std: np.ndarray | None) -> np.ndarray:
        """The most likely action: argmax of the logits, or the mean clipped to the bounds."""
        if log_std is None:
            return out.argmax(axis=1).astype(np.int64, copy=False)
        return np.clip(out, self.low, self.high).astype(np.float32, copy=False)


class NumpyAPPOPolicy(LoadedArrays):
    """APPO's acting side: samples actions with their log-probabilities (``sample``), or plays
    greedily (``act(obs, explore=False)``, the evaluator's)."""

    def __init__(self, config: APPOConfig, spec: SampleSpec, *, seed: int | None = None) -> None:
        config.check()
        self.config = config
        self.obs_shape = tuple(spec.obs_shape)
        self.net = appo_net(config, spec)
        self._params = NamedArrays(self.net.layout(self.obs_shape), seed)
        shape_initial_policy(self._params.arrays, self.net, config.log_std_init)
        self._actions = APPOActions(spec)
        self.rng = np.random.default_rng(seed)  # acting draws, in APPOAgent's order

    def policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(logits, None)`` or ``(mean, log_std)`` for obs ``(B, *obs_shape)`` (see policy_heads)."""
        return policy_heads(self.net, self._params.arrays, obs)

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions for obs ``(B, *obs_shape)`` and their log-probabilities ``(B,)`` float32."""
        return self._actions.sample(self.rng, *self.policy_outputs(obs))

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Sampled actions (``explore``) or the greedy ones."""
        if explore:
            return self.sample(obs)[0]
        return self._actions.greedy(*self.policy_outputs(obs))
