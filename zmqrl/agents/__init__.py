"""Agents: each module holds one algorithm (config, networks, update) behind the core Agent contract."""

from __future__ import annotations

from typing import TYPE_CHECKING

from zmqrl.agents.configs import AgentConfig, DQNConfig, SACConfig
from zmqrl.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

    from zmqrl.agents.dqn import DQNAgent
    from zmqrl.agents.sac import SACAgent
    from zmqrl.spec import SampleSpec


def make_agent(
    config: AgentConfig,
    spec: SampleSpec,
    *,
    epsilon: float | np.ndarray = 0.0,
    device: str | None = None,
    seed: int | None = None,
    action_low: np.ndarray | None = None,
    action_high: np.ndarray | None = None,
) -> DQNAgent | SACAgent:
    """The agent a config asks for, sized for the run's observation and action spaces.

    ``action_low`` / ``action_high`` (the env's ``action_space.low`` / ``.high``) are the bounds a
    continuous-action agent rescales its policy onto; None means [-1, 1]. Discrete agents ignore them.

    Settings that cannot work with this env or machine (an invalid agent value, a discrete agent
    on continuous actions, a CNN torso on flat observations, ``cuda`` without a GPU) raise
    :class:`~zmqrl.errors.ConfigError` before anything is built, so the CLI exits 2 with one line.
    Any ValueError from the constructors themselves is left alone: past these checks it is a bug.
    """
    # The config loader only builds matching (kind, class) pairs: a mismatch is a caller's bug.
    matched = (config.kind, type(config)) in (("dqn", DQNConfig), ("sac", SACConfig))
    if not matched and config.kind in ("dqn", "sac"):
        raise ValueError(
            f"agent.kind '{config.kind}' does not match its config section {type(config).__name__}"
        )
    if not matched:
        raise ValueError(f"agent.kind '{config.kind}' is not known (available: dqn, sac)")
    problem = _settings_problem(config, spec, device, action_low, action_high)
    if problem is not None:
        raise ConfigError(problem)
    if isinstance(config, DQNConfig):
        from zmqrl.agents.dqn import DQNAgent

        assert spec.num_actions is not None  # _settings_problem: DQN needs Discrete actions
        return DQNAgent(config, spec.obs_shape, spec.num_actions, epsilon=epsilon, device=device, seed=seed)
    from zmqrl.agents.sac import SACAgent

    return SACAgent(
        config,
        spec.obs_shape,
        spec.action_shape[0],
        action_low=action_low,
        action_high=action_high,
        epsilon=epsilon,
        device=device,
        seed=seed,
    )


def _settings_problem(
    config: AgentConfig,
    spec: SampleSpec,
    device: str | None,
    action_low: np.ndarray | None,
    action_high: np.ndarray | None,
) -> str | None:
    """What in the user's settings makes this agent impossible to build here, or None."""
    try:
        config.check()
    except ValueError as exc:
        return str(exc)
    if isinstance(config, DQNConfig):
        if spec.num_actions is None:
            return (
                f"agent.kind 'dqn' needs a Discrete action space; this env's actions are continuous "
                f"(Box of shape {spec.action_shape}): use agent.kind 'sac'"
            )
        if config.torso == "nature_cnn" and (problem := _cnn_problem(spec.obs_shape)):
            return problem
    if isinstance(config, SACConfig):
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

        for name, bound in (("low", action_low), ("high", action_high)):
            if bound is not None and not np.all(np.isfinite(np.asarray(bound, np.float64))):
                return (
                    f"agent.kind 'sac' needs finite action bounds (its tanh policy is rescaled onto "
                    f"them); this env's action_space.{name} is {bound}"
                )
    from zmqrl.agents.nets import resolve_device

    try:
        resolve_device(device if device is not None else config.device)
    except ValueError as exc:
        return f"agent.device: {exc}"
    return None


def _cnn_problem(obs_shape: tuple[int, ...]) -> str | None:
    """Why the Nature CNN cannot take these observations, or None: it needs (C, H, W) frames at
    least as big as its kernels and strides allow (36x36 for the paper's layers)."""
    from zmqrl.agents.conv import CONV_LAYERS

    if len(obs_shape) != 3 or min(obs_shape) < 1:
        return (
            f"agent.torso 'nature_cnn' needs image observations (C, H, W); this env's observations "
            f"have shape {tuple(obs_shape)}: use agent.torso 'mlp', or env.preprocess 'atari'"
        )
    height, width = obs_shape[1:]
    for _, kernel, stride in CONV_LAYERS:
        height, width = (height - kernel) // stride + 1, (width - kernel) // stride + 1
    if min(height, width) < 1:
        return (
            f"agent.torso 'nature_cnn' needs larger frames than {obs_shape[1]}x{obs_shape[2]}: "
            f"raise env.atari.screen_size (84 is the standard)"
        )
    return None
