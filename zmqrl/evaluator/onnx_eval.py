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

from zmqrl.checkpoints.onnx_metadata import OnnxMetadata
from zmqrl.checkpoints.onnx_policy import OnnxPolicy, onnx_config
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
    if metadata.obs_keys or isinstance(obs, gym.spaces.Dict):
        problem = keys_problem(metadata, obs)
        if problem is not None:
            return problem
    elif space_text(obs) != metadata.observation_text():
        return f"the model takes observations {metadata.observation_text()}, the env gives {space_text(obs)}"
    action = metadata.action
    if isinstance(act, gym.spaces.Discrete):
        if action.n != int(act.n):
            return f"the model picks among {action.n} actions, the env has {int(act.n)}"
    elif tuple(act.shape or ()) != action.shape:
        return f"the model's actions have shape {list(action.shape)}, the env's {list(act.shape or ())}"
    return None


def keys_problem(metadata: OnnxMetadata, obs: gym.Space[Any]) -> str | None:
    """Why a Dict observation's model cannot read ``obs`` (or a plain model a Dict), naming the
    first key the model takes that the env lacks, or gives in another dtype or shape, or the env's
    first key the model does not take; None when every key fits (their order does not matter: a
    key is fed by its name)."""
    model = metadata.observation_text()
    if not metadata.obs_keys or not isinstance(obs, gym.spaces.Dict):
        return f"the model takes observations {model}, the env gives {space_text(obs)}"
    for entry in metadata.obs_keys:
        sub = obs.spaces.get(entry.key)
        if sub is None:
            return f"the env's observation has no key {entry.key!r}, which the model takes ({model})"
        want = f"{list(entry.shape)} {entry.dtype}"
        if space_text(sub) != want:
            return f"key {entry.key!r}: the model takes {want}, the env gives {space_text(sub)}"
    taken = {entry.key for entry in metadata.obs_keys}
    for key in obs.spaces:
        if key not in taken:
            return f"the env's observation has a key {key!r} the model does not take ({model})"
    return None


def space_text(space: gym.Space[Any]) -> str:
    """An observation space as the messages name it: ``[4] float32``, or a Dict's keys as
    ``{goal: float32 [2], grid: uint8 [1, 7, 7]}`` (as ``OnnxMetadata.observation_text``)."""
    if isinstance(space, gym.spaces.Dict):
        keys = (f"{key}: {dtype_name(sub)} {list(sub.shape or ())}" for key, sub in space.spaces.items())
        return "{" + ", ".join(keys) + "}"
    return f"{list(space.shape or ())} {dtype_name(space)}"


def dtype_name(space: gym.Space[Any]) -> str:
    return np.dtype(space.dtype).name if space.dtype is not None else "none"
