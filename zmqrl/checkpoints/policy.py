"""A trained policy for deployment: ``zmqrl.load_policy(checkpoint).act(obs)``, greedy, on CPU."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.config import Config

# Which checkpoint of a run directory load_policy reads when given the directory.
CHECKPOINT_CHOICES = ("latest", "best")


class DeployedPolicy:
    """Acts greedily with a checkpoint's weights; knows the spaces and the config it was trained with."""

    def __init__(
        self, agent: Any, config: Config, path: Path, observation_space: Any, action_space: Any
    ) -> None:
        self._agent = agent
        self.config = config
        self.path = path  # the checkpoint file it was read from
        self.observation_space = observation_space
        self.action_space = action_space
        self._obs_ndim = len(observation_space.shape)

    @property
    def weights_version(self) -> int:
        return int(self._agent.weights_version)

    def act(self, obs: Any) -> Any:
        """The greedy action for one observation, or actions ``(B, ...)`` for a batch of them."""
        arr = np.asarray(obs, dtype=self.observation_space.dtype)
        single = arr.ndim == self._obs_ndim
        actions = self._agent.act(arr[None] if single else arr, explore=False)
        return actions[0] if single else actions


def checkpoint_path(checkpoint: str | Path, which: str = "latest") -> Path:
    """A checkpoint file, or the ``which`` checkpoint of a run directory (or its checkpoints/)."""
    path = Path(checkpoint)
    if which not in CHECKPOINT_CHOICES:
        raise ValueError(f"which={which!r}: expected one of {', '.join(CHECKPOINT_CHOICES)}")
    if path.is_dir():
        directory = path / "checkpoints" if (path / "checkpoints").is_dir() else path
        path = directory / which
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such checkpoint (train first, or give a ckpt-* file)")
    return path


def load_policy(
    checkpoint: str | Path,
    *,
    which: str = "latest",
    config: Config | str | Path | None = None,
    trust_config: bool = False,
) -> DeployedPolicy:
    """The policy stored in ``checkpoint``: a checkpoint file (``latest``, ``best``, ``ckpt-*``) or
    a run directory, whose ``which`` checkpoint is read ("latest": the run's final weights).

    Its env and agent are built from the config stored in the checkpoint, or from ``config`` (a
    ``Config``, or a YAML file such as the run's own ``config.yaml``) when given. A stored config
    is data from wherever the file came from: if its ``env.id`` or ``agent.kind`` names code to
    import (``module:...``), loading raises :class:`~zmqrl.code_trust.UntrustedCode` (a
    ConfigError) before importing anything, unless ``trust_config=True`` or ``config`` is given.
    Registered gymnasium ids, built-in agents and installed plugins load without either."""
    from zmqrl.checkpoints.files import load_checkpoint
    from zmqrl.envs.factory import make_env
    from zmqrl.evaluator.greedy import checkpoint_config, load_checkpoint_weights, make_eval_agent

    path = checkpoint_path(checkpoint, which)
    payload = load_checkpoint(path)
    cfg = checkpoint_config(payload, path, config, trust_config=trust_config)
    env = make_env(cfg.env, training=False)
    try:
        agent = make_eval_agent(cfg, env)
        load_checkpoint_weights(agent, payload, path)
        return DeployedPolicy(agent, cfg, path, env.observation_space, env.action_space)
    finally:
        env.close()
