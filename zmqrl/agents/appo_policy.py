"""APPO's acting side in numpy: a categorical or Gaussian policy whose actions come with their
log-probabilities, for actors and evaluators (no torch in their processes). With the Nature
CNN, whose convolutions numpy runs many times slower, actors act with ``APPOAgent`` on the CPU
instead (``zmqrl.agents.builtin.make_appo_policy``, as DQN's).

The network is the table ``zmqrl.agents.layers.appo_policy_net``, the same one ``APPOAgent``
builds its torch policy from, so the weights it exports load here name for name. The sampling
rule is written once, here: ``APPOAgent`` acts through these functions too (on numpy views of its
parameters on a CPU, on its torch outputs on a GPU or with the Nature CNN), so with the same seed
and weights both draw the same actions with the same log-probabilities.

Continuous actions (the agreed semantics of the on-policy family): a diagonal Gaussian in the
env's own action units; the action sent is the sample clipped to the spec's finite bounds, and its
log-probability is that of the clipped policy (Fujita & Maeda, 2018), per dimension: the Gaussian
log-density inside the bounds, the log of the Gaussian's mass beyond a bound for an action clipped
to it. The learner evaluates the same rule (``appo_nets.clipped_gaussian_logp``), so the first
ratio of fresh data is 1. The density at the clipped point instead is no probability of what was
sent, and its gradient has the wrong sign beyond a bound: with the mean above ``high``, making a
bad clipped action less likely by it moves the mean further up. APPO on Pendulum diverged on it
(log-probabilities near -5000, so means ~100 std beyond [-2, 2]; approx_kl ~ 1e7). The tail mass
``log Phi((mean - high) / std)`` falls as the mean comes back, and stays in (-inf, 0].
Greedy play is the clipped mean (argmax of the logits for Discrete actions).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from zmqrl.agents.configs import APPOConfig
from zmqrl.agents.keyed import obs_fields, torso_problem
from zmqrl.agents.layers import LOG_STD, LOGITS, MEAN, ActingNet, appo_policy_net, lstm_step
from zmqrl.agents.masks import MASKED_VALUE, mask_numpy
from zmqrl.agents.numpy_policies import LoadedArrays, NamedArrays
from zmqrl.spec import SampleSpec

# Bounds of the Gaussian's log standard deviation (those of APPOConfig.log_std_init): below -20 the
# density at the mean overflows float32's log-probabilities' useful range; above 2 the policy is
# noise on any normalised action scale.
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)
# Below this z, log Phi(z) comes from its asymptotic series (see log_ndtr): there its terms up to
# 105 / z^8 leave a relative error under 1e-10, while erfc(-z / sqrt 2) nears float64's smallest
# numbers (it underflows near z = -38).
LOG_NDTR_SERIES_BELOW = -20.0
_SQRT_HALF = math.sqrt(0.5)
_erfc = np.frompyfunc(math.erfc, 1, 1)  # numpy has no erfc; math's, elementwise (object array)
# The output heads start this many times smaller than torch's default draw (and unbiased): the
# first policy is then close to uniform (Discrete) or centred at 0 with std exp(log_std_init),
# whatever the random torso, as PPO's reference implementations start (a 0.01-gain head).
HEAD_INIT_SCALE = 0.01


def appo_net(config: APPOConfig, spec: SampleSpec) -> ActingNet:
    """The policy's table for this config and spec, after checking what ``check_appo`` checks
    (frames a CNN torso can take; Discrete actions or a 1-D Box); ValueError otherwise. The MLP
    takes observations of any shape, flattened (as DQN's); a Dict observation's keys each through
    their encoder (``zmqrl.agents.keyed``)."""
    if problem := torso_problem(config.torso, spec):
        raise ValueError(problem)
    core = config.core_size if config.core == "lstm" else 0
    inputs = obs_fields(spec)
    if spec.num_actions is not None:
        return appo_policy_net(
            config.torso, config.hidden_sizes, spec.num_actions, 0, config.log_std, core, inputs
        )
    if len(spec.action_shape) != 1 or spec.action_shape[0] < 1:
        raise ValueError(f"APPO needs Discrete actions or a 1-D Box, got action_shape {spec.action_shape}")
    act_dim = spec.action_shape[0]
    return appo_policy_net(config.torso, config.hidden_sizes, None, act_dim, config.log_std, core, inputs)


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


class CoreState:
    """The acting state of a recurrent policy: ``(B, 2, H)`` float32, h and c of each row (env),
    zero at an episode's start. Sized by the first batch after a full reset (or a change of batch
    size, which starts every row over)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.state = np.zeros((0, 2, size), np.float32)

    def rows(self, n: int) -> np.ndarray:
        """The state of ``n`` rows (zeros if it held another number)."""
        if self.state.shape[0] != n:
            self.state = np.zeros((n, 2, self.size), np.float32)
        return self.state

    def reset(self, done: np.ndarray | None = None) -> None:
        """Zero the rows where ``done`` is True; all of them (and the size) when None."""
        if done is None:
            self.state = np.zeros((0, 2, self.size), np.float32)
        elif len(done) == len(self.state):
            self.state[np.asarray(done, bool)] = 0.0


class CoreActing:
    """The acting-state half of ``zmqrl.core.RecurrentPolicy``, for a policy that holds a
    ``CoreState`` in ``_core`` (None: feed-forward): shared by the actors' numpy policy and the
    learner's torch agent, which act the same way."""

    _core: CoreState | None

    @property
    def recurrent(self) -> bool:
        """Whether acting carries an LSTM state (``agent.core: lstm``; zmqrl.core.RecurrentPolicy)."""
        return self._core is not None

    def core_state(self) -> np.ndarray:
        """A copy of the state the next step starts from, ``(B, 2, H)`` (``(0, 2, 0)``: none)."""
        return np.zeros((0, 2, 0), np.float32) if self._core is None else self._core.state.copy()

    def reset_core(self, done: np.ndarray | None = None) -> None:
        """Zero the state of the rows ``done`` (all of them when None)."""
        if self._core is not None:
            self._core.reset(done)


def policy_heads(
    net: ActingNet,
    arrays: Mapping[str, np.ndarray],
    obs: np.ndarray,
    core: CoreState | None = None,
    masked: bool = False,
) -> tuple[np.ndarray, np.ndarray | None]:
    """The policy's outputs for observations ``(B, *obs_shape)``: ``(logits, None)`` for Discrete
    actions (``masked``: illegal ones MASKED_VALUE, see zmqrl.agents.masks), ``(mean, log_std)``
    (``log_std`` clamped, broadcast to ``(B, act_dim)``) for a Box. A recurrent ``net`` steps its
    LSTM from ``core``'s state, and leaves the new one there."""
    if core is None:
        heads = net.forward(arrays, obs)
    else:
        state = core.rows(len(obs))
        h, c = lstm_step(arrays, net.features(arrays, obs), state[:, 0], state[:, 1])
        state[:, 0], state[:, 1] = h, c
        heads = net.heads_of(arrays, h)
    if LOGITS in heads:
        return (mask_numpy(heads[LOGITS], obs) if masked else heads[LOGITS]), None
    mean = heads[MEAN]
    log_std = heads[LOG_STD] if LOG_STD in heads else np.broadcast_to(arrays[LOG_STD], mean.shape)
    return mean, np.clip(log_std, LOG_STD_MIN, LOG_STD_MAX)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise ``log softmax`` in float32, shifted by the row's max so no exp overflows."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def log_ndtr(z: np.ndarray) -> np.ndarray:
    """``log Phi(z)``, the log of the standard normal CDF, float64, finite for every finite ``z``
    (as ``torch.special.log_ndtr``; numpy has none, and scipy is no dependency of an actor).

    ``log(erfc(-z / sqrt 2) / 2)`` down to ``LOG_NDTR_SERIES_BELOW``; below it the asymptotic
    series ``-z^2/2 - log(-z) - log(2 pi)/2 + log(1 - 1/z^2 + 3/z^4 - 15/z^6 + 105/z^8)``.
    """
    z = np.asarray(z, dtype=np.float64)
    out = np.empty_like(z)
    far = z < LOG_NDTR_SERIES_BELOW
    zf = z[far]
    r = 1.0 / (zf * zf)
    series = r * (-1.0 + r * (3.0 + r * (-15.0 + r * 105.0)))
    out[far] = -0.5 * zf * zf - np.log(-zf) - HALF_LOG_2PI + np.log1p(series)
    near = ~far
    out[near] = np.log(0.5 * np.asarray(_erfc(-_SQRT_HALF * z[near]), dtype=np.float64))
    return out


def clipped_gaussian_logp(
    mean: np.ndarray, log_std: np.ndarray, actions: np.ndarray, low: np.ndarray, high: np.ndarray
) -> np.ndarray:
    """Log-probability ``(B,)`` float32 of clipped actions ``(B, act_dim)`` under the diagonal
    Gaussian ``N(mean, exp(log_std))`` clipped to ``[low, high]``, as the learner's
    ``appo_nets.clipped_gaussian_logp`` computes it. Per dimension: the log-density inside the
    bounds; ``log Phi(z)`` for an action at (or below) ``low``, ``log Phi(-z)`` at (or above)
    ``high``, ``z = (action - mean) / std`` (at a bound, the bound's own z); summed. An infinite
    bound is never reached, so it leaves its side to the density."""
    z = (actions - mean) / np.exp(log_std)
    logp = -0.5 * z * z - log_std - np.float32(HALF_LOG_2PI)
    at_low, at_high = actions <= low, actions >= high
    if at_low.any():
        logp[at_low] = log_ndtr(z[at_low])
    if at_high.any():
        logp[at_high] = log_ndtr(-z[at_high])
    return logp.sum(axis=1, dtype=np.float32)


class APPOActions:
    """The acting rule on the policy's outputs, shared by ``NumpyAPPOPolicy`` and ``APPOAgent``
    (same draws from the same generator, in the same order)."""

    def __init__(self, spec: SampleSpec) -> None:
        self.discrete = spec.num_actions is not None
        self.masked = spec.action_mask  # the logits given are masked already (see policy_heads)
        bounds = (np.zeros(0, np.float32), np.zeros(0, np.float32)) if self.discrete else action_bounds(spec)
        self.low: np.ndarray = bounds[0]
        self.high: np.ndarray = bounds[1]

    def sample(
        self, rng: np.random.Generator, out: np.ndarray, log_std: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Actions drawn from the policy and their log-probabilities ``(B,)`` float32: int64 ``(B,)``
        by inverse CDF over the softmax of ``out`` (logits), or float32 ``(B, act_dim)`` samples of
        ``N(out, exp(log_std))`` clipped to the bounds, with their probability under the clipped
        policy (``clipped_gaussian_logp``)."""
        if log_std is None:
            log_probs = log_softmax(out)
            cdf = np.cumsum(np.exp(log_probs, dtype=np.float64), axis=1)
            draws = rng.random((len(out), 1))
            # The last action (a masked row's last legal one: MASKED_VALUE logits have zero
            # probability) takes whatever rounding left of the cdf beyond its final entry.
            last = out.shape[1] - 1
            if self.masked:
                last = last - (out > MASKED_VALUE / 2)[:, ::-1].argmax(axis=1)
            actions = np.minimum((draws >= cdf).sum(axis=1), last).astype(np.int64)
            return actions, log_probs[np.arange(out.shape[0]), actions].astype(np.float32, copy=False)
        noise = rng.standard_normal(out.shape, dtype=np.float32)
        actions = np.clip(out + np.exp(log_std) * noise, self.low, self.high).astype(np.float32, copy=False)
        return actions, clipped_gaussian_logp(out, log_std, actions, self.low, self.high)

    def greedy(self, out: np.ndarray, log_std: np.ndarray | None) -> np.ndarray:
        """The most likely action: argmax of the logits, or the mean clipped to the bounds."""
        if log_std is None:
            return out.argmax(axis=1).astype(np.int64, copy=False)
        return np.clip(out, self.low, self.high).astype(np.float32, copy=False)


class NumpyAPPOPolicy(CoreActing, LoadedArrays):
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
        self._masked = spec.action_mask
        self.rng = np.random.default_rng(seed)  # acting draws, in APPOAgent's order
        self._core = CoreState(self.net.core) if self.net.core else None

    def policy_outputs(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """``(logits, None)`` or ``(mean, log_std)`` for obs ``(B, *obs_shape)`` (see policy_heads);
        a recurrent policy's state advances one step."""
        return policy_heads(self.net, self._params.arrays, obs, self._core, self._masked)

    def sample(self, obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Sampled actions for obs ``(B, *obs_shape)`` and their log-probabilities ``(B,)`` float32."""
        return self._actions.sample(self.rng, *self.policy_outputs(obs))

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        """Sampled actions (``explore``) or the greedy ones."""
        if explore:
            return self.sample(obs)[0]
        return self._actions.greedy(*self.policy_outputs(obs))
