"""The built-in agents, dqn, sac, appo and r2d2, as registry plugins: their settings checks and factories.

Registered through the same :mod:`zmqrl.agents.registry` as any plugin. Nothing here imports
torch until a learner (or a torch-backed policy) is built: actors with an MLP or the MinAtar CNN
act in numpy (DQN's, APPO's and R2D2's alike).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from zmqrl.agents.configs import APPOConfig, DQNConfig, SACConfig
from zmqrl.agents.plugin import AgentPlugin, PriorityFn
from zmqrl.agents.r2d2_config import R2D2Config

if TYPE_CHECKING:
    from zmqrl.core import LearningAgent, Policy
    from zmqrl.spec import SampleSpec


def device_problem(name: str) -> str | None:
    """Why ``name`` cannot be used here (``cuda`` without a GPU), or None. ``cpu`` is decided
    without importing torch, so a CPU actor's checks stay torch-free."""
    if name == "cpu":
        return None
    from zmqrl.agents.nets import resolve_device

    try:
        resolve_device(name)
    except ValueError as exc:
        return f"agent.device: {exc}"
    return None


def torso_problem(torso: str, spec: SampleSpec) -> str | None:
    """Why a CNN ``torso`` cannot take this env's observations (frames too small, not frames; a
    Dict observation without an image key), or None; the MLP takes any shape, flattened."""
    if torso == "mlp":
        return None
    from zmqrl.agents.keyed import torso_problem as keyed_problem  # numpy: only for CNN torsos

    return keyed_problem(torso, spec)


# -------------------------------------------------------------------------------------- dqn


def check_dqn(config: DQNConfig, spec: SampleSpec, device: str | None) -> str | None:
    """DQN needs Discrete actions, and image frames big enough for its kernels when its torso is a CNN."""
    if spec.num_actions is None:
        return (
            f"agent.kind 'dqn' needs a Discrete action space; this env's actions are continuous "
            f"(Box of shape {spec.action_shape}): use agent.kind 'sac'"
        )
    return torso_problem(config.torso, spec) or device_problem(
        device if device is not None else config.device
    )


def make_dqn_learner(
    config: DQNConfig, spec: SampleSpec, *, seed: int | None, device: str | None
) -> LearningAgent:
    from zmqrl.agents.dqn import DQNAgent

    # Its update takes transitions only, which is all a replay agent's learner gives it (the
    # contract's update takes rollouts too, for on-policy agents).
    return cast("LearningAgent", DQNAgent(config, spec, device=device, seed=seed))


def make_dqn_policy(config: DQNConfig, spec: SampleSpec, *, seed: int | None) -> Policy:
    """The numpy Q-network for the MLP and MinAtar CNN torsos (no torch in the actor); the torch
    agent for the Nature CNN, whose 84x84 convolutions numpy would run many times slower."""
    from zmqrl.agents.numpy_policies import NUMPY_DQN_TORSOS

    if config.torso in NUMPY_DQN_TORSOS:
        from zmqrl.agents.numpy_policies import NumpyDQNPolicy

        return NumpyDQNPolicy(config, spec, seed=seed)
    from zmqrl.agents.dqn import DQNAgent

    return DQNAgent(config, spec, device="cpu", seed=seed)


def dqn_priorities(policy: Policy) -> PriorityFn:
    """Ape-X initial priorities: ``|TD error|`` of fresh transitions under the actor's Q-network,
    which both DQN policies (``NumpyDQNPolicy``, ``DQNAgent``) compute as ``update`` does."""
    return cast(PriorityFn, getattr(policy, "initial_priorities"))  # noqa: B009 (both classes have it)


# -------------------------------------------------------------------------------------- sac


def check_sac(config: SACConfig, spec: SampleSpec, device: str | None) -> str | None:
    """SAC needs a 1-D Box action space with finite bounds (its tanh policy is rescaled onto them)."""
    if spec.num_actions is not None:
        return (
            f"agent.kind 'sac' needs a continuous (Box) action space; this env's actions are "
            f"Discrete({spec.num_actions}): use agent.kind 'dqn'"
        )
    if len(spec.action_shape) != 1:
        return (
            f"agent.kind 'sac' needs a 1-D Box action space; this env's actions have shape "
            f"{spec.action_shape}"
        )
    import numpy as np

    for name, bound in (("low", spec.action_low), ("high", spec.action_high)):
        if bound is not None and not np.all(np.isfinite(np.asarray(bound, np.float64))):
            return (
                f"agent.kind 'sac' needs finite action bounds (its tanh policy is rescaled onto "
                f"them); this env's action_space.{name} is {np.asarray(bound, np.float32)}"
            )
    return device_problem(device if device is not None else config.device)


def make_sac_learner(
    config: SACConfig, spec: SampleSpec, *, seed: int | None, device: str | None
) -> LearningAgent:
    from zmqrl.agents.sac import SACAgent

    return cast("LearningAgent", SACAgent(config, spec, device=device, seed=seed))  # as DQN's


def make_sac_policy(config: SACConfig, spec: SampleSpec, *, seed: int | None) -> Policy:
    from zmqrl.agents.numpy_policies import NumpySACPolicy

    return NumpySACPolicy(config, spec, seed=seed)


DQN_PLUGIN = AgentPlugin(
    name="dqn",
    config_class=DQNConfig,
    make_learner=make_dqn_learner,
    make_policy=make_dqn_policy,
    make_priorities=dqn_priorities,
    check=check_dqn,
    # Fields that change the acting network or the meaning of a transition.
    fingerprint_fields=("kind", "hidden_sizes", "dueling", "torso", "n_step", "gamma"),
    description="DQN with double-Q targets, dueling heads, MLP, Nature or MinAtar CNN (Discrete actions)",
)
SAC_PLUGIN = AgentPlugin(
    name="sac",
    config_class=SACConfig,
    make_learner=make_sac_learner,
    make_policy=make_sac_policy,
    check=check_sac,
    fingerprint_fields=("kind", "hidden_sizes", "n_step", "gamma"),
    description="soft actor-critic with twin critics and entropy tuning (1-D Box actions)",
)


# -------------------------------------------------------------------------------------- appo


def check_appo(config: APPOConfig, spec: SampleSpec, device: str | None) -> str | None:
    """APPO acts on Discrete actions (categorical policy) or a 1-D Box (Gaussian policy); a CNN
    torso needs frames big enough for its kernels, the MLP flattens observations of any shape
    (as DQN's does)."""
    if spec.num_actions is None and len(spec.action_shape) != 1:
        return (
            f"agent.kind 'appo' needs Discrete actions or a 1-D Box; this env's actions have shape "
            f"{spec.action_shape}"
        )
    return torso_problem(config.torso, spec) or device_problem(
        device if device is not None else config.device
    )


def make_appo_learner(
    config: APPOConfig, spec: SampleSpec, *, seed: int | None, device: str | None
) -> LearningAgent:
    from zmqrl.agents.appo import APPOAgent

    # Its update takes rollouts only, which is all an on-policy agent's learner gives it.
    return cast("LearningAgent", APPOAgent(config, spec, device=device, seed=seed))


def make_appo_policy(config: APPOConfig, spec: SampleSpec, *, seed: int | None) -> Policy:
    """The numpy policy for the MLP and MinAtar CNN torsos (no torch in the actor); the torch
    agent on the CPU for the Nature CNN (as DQN's), which acts through torch and samples by the
    same rule (``zmqrl.agents.appo_policy.APPOActions``)."""
    from zmqrl.agents.appo_policy import NumpyAPPOPolicy, appo_net

    if appo_net(config, spec).numpy_acting:
        return NumpyAPPOPolicy(config, spec, seed=seed)
    from zmqrl.agents.appo import APPOAgent

    return APPOAgent(config, spec, device="cpu", seed=seed)


APPO_PLUGIN = AgentPlugin(
    name="appo",
    config_class=APPOConfig,
    make_learner=make_appo_learner,
    make_policy=make_appo_policy,
    check=check_appo,
    # The acting network (torso, widths, how the Gaussian's spread is made) and the discount of the targets.
    # The core changes the weights and the rollouts (a recurrent run's rows carry a start state).
    fingerprint_fields=("kind", "hidden_sizes", "torso", "log_std", "gamma", "core", "core_size"),
    description=(
        "asynchronous PPO / IMPALA on V-trace targets, on-policy, MLP, Nature or MinAtar CNN "
        "(Discrete or 1-D Box actions)"
    ),
    on_policy=True,
)


# -------------------------------------------------------------------------------------- r2d2


def check_r2d2(config: R2D2Config, spec: SampleSpec, device: str | None) -> str | None:
    """Recurrent DQN needs Discrete actions, and frames big enough for its kernels when its torso
    is a CNN (the MLP takes any shape, flattened), as DQN's."""
    if spec.num_actions is None:
        return (
            f"agent.kind 'r2d2' needs a Discrete action space; this env's actions are continuous "
            f"(Box of shape {spec.action_shape})"
        )
    return torso_problem(config.torso, spec) or device_problem(
        device if device is not None else config.device
    )


def make_r2d2_learner(
    config: R2D2Config, spec: SampleSpec, *, seed: int | None, device: str | None
) -> LearningAgent:
    from zmqrl.agents.r2d2 import R2D2Agent

    # Its update takes sequences only, which is all a sequence agent's learner gives it.
    return cast("LearningAgent", R2D2Agent(config, spec, device=device, seed=seed))


def make_r2d2_policy(config: R2D2Config, spec: SampleSpec, *, seed: int | None) -> Policy:
    """The numpy recurrent Q-network, a state per env, for the MLP and MinAtar CNN torsos (no torch
    in the actor); the torch agent on the CPU for the Nature CNN (as DQN's and APPO's), which keeps
    its states by the same methods (``CoreActing``)."""
    from zmqrl.agents.r2d2_policy import NumpyR2D2Policy, r2d2_net

    if r2d2_net(config, spec).numpy_acting:
        return NumpyR2D2Policy(config, spec, seed=seed)
    from zmqrl.agents.r2d2 import R2D2Agent

    return R2D2Agent(config, spec, device="cpu", seed=seed)


R2D2_PLUGIN = AgentPlugin(
    name="r2d2",
    config_class=R2D2Config,
    make_learner=make_r2d2_learner,
    make_policy=make_r2d2_policy,
    check=check_r2d2,
    # The acting network, and what a window on the wire is (its lengths, its targets' discount).
    fingerprint_fields=(
        "kind", "hidden_sizes", "torso", "core_size", "sequence_length", "burn_in", "n_step", "gamma"
    ),
    description=(
        "recurrent DQN (R2D2): an LSTM core after an MLP, Nature or MinAtar CNN, replayed sequences "
        "with burn-in (Discrete actions)"
    ),
    sequences=True,
)
BUILTIN_PLUGINS = (DQN_PLUGIN, SAC_PLUGIN, APPO_PLUGIN, R2D2_PLUGIN)
