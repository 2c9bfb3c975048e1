"""The RL-Zoo's tuned CartPole-v1 settings for each Stable-Baselines3 algorithm ``zmqrl bench
solve`` races, and the SB3 model built from them.

The settings are plain data, importable without SB3, so ``zmqrl bench solve`` can record them in its
JSON without paying SB3's import; :func:`make_model` imports SB3 only when a run builds its model.
Values are written as the Zoo's files write them (``"lin_0.001"`` is the Zoo's linear schedule from
0.001 at the start of training to 0 at ``n_timesteps``), so the JSON shows what was configured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stable_baselines3.common.base_class import BaseAlgorithm

ENV_ID = "CartPole-v1"
# The prefix the Zoo gives a value annealed linearly to 0 over the run ("lin_0.001").
LINEAR_PREFIX = "lin_"


@dataclass(frozen=True)
class ZooSettings:
    """One algorithm's Zoo entry for CartPole-v1: the model's keyword arguments, and the two
    settings that are not (how many envs step in the training vector env, and the run's length)."""

    algo: str  # "dqn" or "ppo": the SB3 class
    n_envs: int  # envs in the training vector env (the Zoo's n_envs; 1 when it names none)
    n_timesteps: int  # env steps the Zoo trains for; a linear schedule reaches 0 here
    hyperparameters: dict[str, Any]  # keyword arguments of the SB3 class, as the Zoo file writes them

    def meta(self) -> dict[str, Any]:
        """What ``zmqrl bench solve --json`` records of this side."""
        return {
            "algo": self.algo,
            "policy": "MlpPolicy",
            "n_envs": self.n_envs,
            "n_timesteps": self.n_timesteps,
            **self.hyperparameters,
        }


# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 (n_timesteps: 5e4, policy: MlpPolicy).
ZOO_CARTPOLE_DQN = ZooSettings(
    algo="dqn",
    n_envs=1,
    n_timesteps=50_000,
    hyperparameters={
        "learning_rate": 2.3e-3,
        "batch_size": 64,
        "buffer_size": 100_000,
        "learning_starts": 1_000,
        "gamma": 0.99,
        "target_update_interval": 10,
        "train_freq": 256,
        "gradient_steps": 128,
        "exploration_fraction": 0.16,
        "exploration_final_eps": 0.04,
        "policy_kwargs": {"net_arch": [256, 256]},
    },
)
# rl-baselines3-zoo hyperparams/ppo.yml, CartPole-v1 ("# Tuned"; the same entry at commits 00128b5
# and 208b6fd of DLR-RM/rl-baselines3-zoo): n_envs 8, n_timesteps 1e5, policy MlpPolicy, and the
# model's arguments below. Everything else is SB3's PPO default (vf_coef 0.5, max_grad_norm 0.5,
# normalized advantages, separate 64x64 tanh policy and value networks).
ZOO_CARTPOLE_PPO = ZooSettings(
    algo="ppo",
    n_envs=8,
    n_timesteps=100_000,
    hyperparameters={
        "n_steps": 32,
        "batch_size": 256,
        "gae_lambda": 0.8,
        "gamma": 0.98,
        "n_epochs": 20,
        "ent_coef": 0.0,
        "learning_rate": "lin_0.001",
        "clip_range": "lin_0.2",
    },
)
ZOO_CARTPOLE = {s.algo: s for s in (ZOO_CARTPOLE_DQN, ZOO_CARTPOLE_PPO)}
SB3_ALGOS = tuple(ZOO_CARTPOLE)


@dataclass(frozen=True)
class LinearToZero:
    """The Zoo's ``lin_<x>`` schedule: ``initial`` at the start, falling linearly to 0 at the end
    of ``learn`` (SB3 calls a schedule with the fraction of the run still to go, 1 down to 0). A
    dataclass rather than a closure so the model stays picklable."""

    initial: float

    def __call__(self, progress_remaining: float) -> float:
        return progress_remaining * self.initial


def model_kwargs(settings: ZooSettings) -> dict[str, Any]:
    """The SB3 class's keyword arguments: the Zoo's ``lin_<x>`` strings become schedules."""
    return {
        key: LinearToZero(float(value[len(LINEAR_PREFIX) :]))
        if isinstance(value, str) and value.startswith(LINEAR_PREFIX)
        else value
        for key, value in settings.hyperparameters.items()
    }


def make_model(algo: str, seed: int) -> BaseAlgorithm:
    """The SB3 model with the Zoo's CartPole settings for ``algo``, on the CPU, its training envs
    seeded from ``seed`` (PPO: the Zoo's 8 envs in one process, SB3's ``make_vec_env``)."""
    import gymnasium as gym
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.env_util import make_vec_env

    settings = ZOO_CARTPOLE[algo]
    kwargs = model_kwargs(settings)
    if algo == "dqn":
        return DQN("MlpPolicy", gym.make(ENV_ID), seed=seed, device="cpu", verbose=0, **kwargs)
    env = make_vec_env(ENV_ID, n_envs=settings.n_envs, seed=seed)
    return PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **kwargs)
