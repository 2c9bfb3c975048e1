"""A trained policy for deployment: ``zmqrl.load_policy(checkpoint).act(obs)``, greedy, on CPU.

Also how any checkpoint is read back into an agent (by load_policy, ``zmqrl eval`` and the
evaluator): the config to play it with (:func:`checkpoint_config`: a stored config is data from
elsewhere and may not choose code to import, see :mod:`zmqrl.code_trust`), the agent it loads
into (:func:`make_eval_agent`) and the loading itself (:func:`load_checkpoint_weights`).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from zmqrl.config import Config
from zmqrl.core import LearningAgent, Policy, is_recurrent
from zmqrl.envs.action_masks import as_masked_rows
from zmqrl.envs.records import is_record_space, obs_entries
from zmqrl.types import record_dtype, records_batch

if TYPE_CHECKING:
    import gymnasium as gym

# Which checkpoint of a run directory load_policy reads when given the directory.
CHECKPOINT_CHOICES = ("latest", "best")
# ``payload["contents"]`` of a weights-only checkpoint (the evaluator's ``best``): just the acting
# network as published, no optimiser or counters. (``format`` is the checkpoint layout version,
# set by ``save_checkpoint``.) Full-state checkpoints have no ``contents`` and hold ``agent``.
WEIGHTS_ONLY = "weights"


class DeployedPolicy:
    """Acts greedily with a checkpoint's weights; knows the spaces and the config it was trained with."""

    def __init__(
        self,
        agent: Any,
        config: Config,
        path: Path,
        observation_space: Any,
        action_space: Any,
        weights_version: int = 0,
    ) -> None:
        self._agent = agent
        self.weights_version = weights_version  # as the checkpoint says it was published
        self.config = config
        self.path = path  # the checkpoint file it was read from
        self.observation_space = observation_space
        self.action_space = action_space
        # A Dict observation is played as records (zmqrl.types), one field per key; a masked one
        # with several keys beside its mask too (a masked one of one key is a Box of flat rows).
        keyed = is_record_space(observation_space)
        self._records = record_dtype(obs_entries(observation_space)) if keyed else None
        self._obs_ndim = 0 if self._records is not None else len(observation_space.shape)

    @property
    def recurrent(self) -> bool:
        """Whether the policy keeps a state between calls (APPO with ``agent.core: lstm``): then
        ``act`` continues the episode the previous calls played (one row per env, same order), and
        :meth:`reset` starts a new one."""
        return is_recurrent(self._agent)

    def reset(self) -> None:
        """Start a new episode: a recurrent policy's state back to zero (nothing for the others).
        Call it after every ``env.reset()``; a new policy starts from a zero state."""
        if is_recurrent(self._agent):
            self._agent.reset_core()

    def act(self, obs: Any) -> Any:
        """The greedy action for one observation, or actions ``(B, ...)`` for a batch of them
        (a recurrent policy: the next step of the episode since the last :meth:`reset`).

        A masked env's policy takes its rows (as ``make_env`` gives them) or the raw Dict
        observation ``{"action_mask": .., <entry>: ..}`` (one, or batched as a vector env gives
        it), and only ever picks an action its mask allows. A Dict observation's policy takes the
        Dict as the env gives it (``{key: array}``, one or batched) or records as ``make_env`` gives
        them; a masked one of several keys too (its ``action_mask`` any 0/1 array, as the env's)."""
        if self._records is not None:
            batch, single = records_batch(obs, self._records)
            actions = self._agent.act(batch, explore=False)
            return actions[0] if single else actions
        if isinstance(obs, Mapping):
            obs = as_masked_rows(obs, np.dtype(self.observation_space.dtype))
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
    from zmqrl.checkpoints.files import checkpoint_weights_version, load_checkpoint
    from zmqrl.envs.factory import make_env

    path = checkpoint_path(checkpoint, which)
    payload = load_checkpoint(path)
    cfg = checkpoint_config(payload, path, config, trust_config=trust_config)
    env = make_env(cfg.env, training=False)
    try:
        agent = make_eval_agent(cfg, env)
        load_checkpoint_weights(agent, payload, path)
        version = checkpoint_weights_version(payload)
        return DeployedPolicy(agent, cfg, path, env.observation_space, env.action_space, version)
    finally:
        env.close()


def checkpoint_config(
    payload: dict[str, Any],
    path: Path,
    config: Config | str | Path | None = None,
    overrides: list[str] | None = None,
    trust_config: bool = False,
) -> Config:
    """The config to play the checkpoint at ``path`` with, ``overrides`` applied last.

    ``config`` is the caller's, trusted like any config they pass: a ``Config`` built in code, or a
    YAML file read as ``zmqrl launch`` reads one (environment variables too). Without it the config
    stored in the checkpoint is used, which may name code to import (``env.id`` or ``agent.kind``
    as ``module:...``) only with ``trust_config`` or where ``overrides`` give that key: anything
    else raises :class:`~zmqrl.code_trust.UntrustedCode` before any module is imported.
    Registered names (gymnasium ids, built-in and installed agents) need neither.
    """
    from zmqrl.config import config_from_dict, load_config

    if isinstance(config, Config):
        return config_from_dict(config.to_dict(), "<config built in code>", overrides, trusted=True)
    if config is not None:
        return load_config(config, overrides)
    stored = payload.get("config")
    if not isinstance(stored, dict):
        raise ValueError(f"{path}: holds no config to play it with; give one (--config FILE, config=...)")
    return config_from_dict(stored, f"{path} (stored config)", overrides, trusted=trust_config)


def make_eval_agent(cfg: Config, env: gym.Env[Any, Any], seed: int | None = None) -> LearningAgent:
    """The agent's learning side on the CPU, sized for ``env``: what a full-state checkpoint
    (``load_state_dict``) loads into (a continuous policy also needs the env's action bounds,
    which the spec carries)."""
    from zmqrl.agents import make_learner
    from zmqrl.envs.factory import sample_spec

    return make_learner(cfg.agent, sample_spec(env), device="cpu", seed=seed)


def load_checkpoint_weights(agent: Policy, payload: dict[str, Any], path: Path) -> None:
    """Load a checkpoint's policy into ``agent``: a weights-only payload (``checkpoints/best`` of
    an evaluator) through ``load_weights``, which any policy has; a full training state through
    ``load_state_dict``, which only a learning agent (:func:`make_eval_agent`) has. (Which version
    that was: ``zmqrl.checkpoints.files.checkpoint_weights_version``.)"""
    if payload.get("contents") == WEIGHTS_ONLY:
        arrays = {name: tensor.numpy() for name, tensor in payload["weights"].items()}
        try:
            agent.load_weights(arrays)
        except ValueError as exc:
            raise ValueError(f"{path}: the agent refused the stored weights ({exc})") from None
    elif "agent" in payload:
        if not isinstance(agent, LearningAgent):
            raise ValueError(f"{path}: a full training state needs the learning agent (make_eval_agent)")
        try:
            agent.load_state_dict(payload["agent"])
        except RuntimeError as exc:  # torch: a header line, then one line per missing key or size
            first = (str(exc).splitlines()[1:] or [str(exc)])[0].strip()
            raise ValueError(
                f"{path}: the stored network does not fit the one this config builds ({first}); "
                "play it with the config it was trained with (its run's config.yaml)"
            ) from None
    else:
        raise ValueError(f"{path}: holds neither an agent state nor weights")
