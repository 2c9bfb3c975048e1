"""``zmqrl eval --onnx``: greedy episodes of an exported policy, played with onnxruntime, no torch.

The episodes are those ``zmqrl eval`` plays for a checkpoint (:func:`zmqrl.evaluator.greedy.evaluate`:
in lockstep, episode i reset with ``seed + i``), in the env the model's metadata describes (or the
caller's config), so the two scores of one policy compare.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from zmqrl.checkpoints.onnx_policy import OnnxMetadata, OnnxPolicy, onnx_config
from zmqrl.evaluator.greedy import EvalResult, evaluate


def evaluate_onnx(
    path: Path,
    episodes: int,
    seed: int = 0,
    overrides: list[str] | None = None,
    *,
    config: str | Path | None = None,
    trust_config: bool = False,
) -> EvalResult:
    """Greedy episodes of the exported policy at ``path``, in envs built from the env section
    stored in it (an ``env.id`` naming a module needs ``trust_config``, or the caller's own
    ``config``/``overrides``). ValueError when the env's spaces are not the model's."""
    from zmqrl.envs.factory import make_env

    policy = OnnxPolicy(path)
    cfg = onnx_config(policy.metadata, str(path), config, overrides, trust_config)
    envs = [make_env(cfg.env, training=False) for _ in range(episodes)]
    try:
        problem = spaces_problem(policy.metadata, envs[0])
        if problem is not None:
            raise ValueError(f"{path}: {problem}")
        return evaluate(policy, envs, seed=seed)
    finally:
        for env in envs:
            env.close()


def spaces_problem(metadata: OnnxMetadata, env: gym.Env[Any, Any]) -> str | None:
    """Why the model cannot act in ``env`` (other observations, or other actions), or None."""
    obs, act = env.observation_space, env.action_space
    obs_shape, obs_dtype = tuple(obs.shape or ()), np.dtype(obs.dtype).name if obs.dtype else None
    if (obs_shape, obs_dtype) != (metadata.obs_shape, metadata.obs_dtype):
        return (
            f"the model takes observations {list(metadata.obs_shape)} {metadata.obs_dtype}, the env "
            f"gives {list(obs_shape)} {obs_dtype}"
        )
    action = metadata.action
    if isinstance(act, gym.spaces.Discrete):
        if action.n != int(act.n):
            return f"the model picks among {action.n} actions, the env has {int(act.n)}"
    elif tuple(act.shape or ()) != action.shape:
        return f"the model's actions have shape {list(action.shape)}, the env's {list(act.shape or ())}"
    return None
