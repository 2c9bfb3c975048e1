"""Greedy evaluation: several episodes played in lockstep so the policy runs once per step, batched.

Also how a saved policy is played again: ``evaluate_checkpoint`` reads both checkpoint kinds (the
learner's full training state, and the evaluator's weights-only ``best``), optionally on video,
with the config stored in it or the caller's own (what reads a checkpoint back into an agent is
:mod:`zmqrl.checkpoints.policy`).
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import gymnasium as gym
import numpy as np

from zmqrl.core import Policy, is_recurrent

if TYPE_CHECKING:
    from zmqrl.config import Config, EnvConfig

# Eval env seeds start here (+ run.seed), far from actor seeds, so evaluation never replays a
# training episode; the learner's own evaluations use the same offset.
EVAL_SEED_OFFSET = 999_999
# File names of recorded episodes: <prefix>-episode-<i>.mp4 (gymnasium's RecordVideo naming).
VIDEO_PREFIX = "eval"


class EvalResult(NamedTuple):
    mean: float
    std: float
    returns: list[float]
    lengths: list[int]
    videos: tuple[Path, ...] = ()  # episode videos written by evaluate_checkpoint(video_dir=...)


class EvaluationAborted(Exception):
    """``evaluate``'s ``tick`` asked to stop before every episode had finished."""


class VideoUnavailable(RuntimeError):
    """Recording was asked for, but moviepy (the video extra), or what the env draws its frames
    with, is not installed."""


class EvalTracker:
    """The running record of a run's evaluations, kept the same way by the learner and the
    evaluator: the last and best mean return, every record, the first that reached the target, and
    the first at which the target was *held*: ``hold`` evaluations in a row at or above it (one lucky
    evaluation followed by untrained scores is not success)."""

    def __init__(self, target: float | None, hold: int = 3) -> None:
        self.target = target
        self.hold = hold
        self.last = float("nan")
        self.best = -float("inf")
        self.history: list[dict[str, Any]] = []
        self.reached: dict[str, Any] | None = None  # the first record at or above the target
        self.held: dict[str, Any] | None = None  # the record completing the first run of `hold` in a row
        self._streak = 0  # evaluations in a row at or above the target, up to now

    def add(self, result: EvalResult, **fields: float) -> tuple[dict[str, Any], bool]:
        """Record ``result`` with ``fields`` (e.g. updates, weights version); returns the record and
        whether it is the best so far (ties count: the later weights are kept)."""
        record: dict[str, Any] = {**fields, "time": time.time(), "mean": result.mean, "std": result.std}
        self.history.append(record)
        self.last = result.mean
        improved = result.mean >= self.best
        if improved:
            self.best = result.mean
        if self.target is not None:
            self._streak = self._streak + 1 if result.mean >= self.target else 0
            if self.reached is None and self._streak >= 1:
                self.reached = record
            if self.held is None and self._streak >= self.hold:
                self.held = record
        return record, improved

    @property
    def holding(self) -> bool:
        """Whether the latest ``hold`` evaluations were all at or above the target: what
        ``learner.stop_at_target`` ends a run on. Unlike ``held`` (the first time it happened, kept
        for the record) this is about now, so a resumed run whose record says "held" long ago
        stops only when it holds the target again."""
        return self.target is not None and self._streak >= self.hold

    @property
    def best_or_nan(self) -> float:
        """The best mean return, NaN before the first evaluation (for heartbeats and stats)."""
        return self.best if math.isfinite(self.best) else float("nan")

    def state(self) -> dict[str, Any]:
        return {
            "last": self.last,
            "best": self.best,
            "history": self.history,
            "target_reached": self.reached,
            "target_held": self.held,
            "streak": self._streak,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self.last = float(state.get("last", float("nan")))
        self.best = float(state.get("best", -float("inf")))
        self.history = list(state.get("history", []))
        self.reached = state.get("target_reached")
        self.held = state.get("target_held")
        self._streak = int(state.get("streak", 0))


def evaluate(
    agent: Policy, envs: list[gym.Env[Any, Any]], seed: int, tick: Callable[[], bool] | None = None
) -> EvalResult:
    """One greedy episode in each env (env i reset with ``seed + i``); returns their statistics.

    ``tick`` is called once per lockstep step, so a long evaluation can keep heartbeating and
    notice a stop request; when it returns True, ``EvaluationAborted`` is raised.

    A recurrent policy (``zmqrl.core.RecurrentPolicy``) starts every episode from a zero state and
    keeps one row per env: it acts on all of them at every step (a finished env's last observation
    again, its action unused), so each row's state stays its env's."""
    recurrent = is_recurrent(agent)
    if recurrent:
        agent.reset_core()  # type: ignore[attr-defined]
    obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
    returns = [0.0] * len(envs)
    lengths = [0] * len(envs)
    live = list(range(len(envs)))
    while live:
        if tick is not None and tick():
            raise EvaluationAborted(f"stopped after {max(lengths)} steps")
        if recurrent:
            actions = agent.act(np.stack(obs), explore=False)[live]
        else:
            actions = agent.act(np.stack([obs[i] for i in live]), explore=False)
        still: list[int] = []
        for i, action in zip(live, actions, strict=True):
            obs[i], reward, terminated, truncated, _ = envs[i].step(action)
            returns[i] += float(reward)
            lengths[i] += 1
            if not (terminated or truncated):
                still.append(i)
        live = still
    return EvalResult(float(np.mean(returns)), float(np.std(returns)), returns, lengths)


def make_eval_policy(cfg: Config, env: gym.Env[Any, Any], seed: int | None = None) -> Policy:
    """The agent's acting side (torch-free where the agent allows), greedy, sized for ``env``: all
    an evaluator of published weights needs."""
    from zmqrl.agents import make_policy
    from zmqrl.envs.factory import sample_spec

    return make_policy(cfg.agent, sample_spec(env), seed=seed)


def require_video_support() -> None:
    """Fail before anything is played when episodes cannot be written as video."""
    try:
        import moviepy  # noqa: F401
    except ImportError:
        raise VideoUnavailable(
            'recording videos needs moviepy, which is not installed: pip install -e ".[video]"'
        ) from None


def evaluate_checkpoint(
    path: Path,
    episodes: int,
    seed: int = 0,
    overrides: list[str] | None = None,
    video_dir: Path | None = None,
    *,
    config: Config | str | Path | None = None,
    trust_config: bool = False,
) -> EvalResult:
    """Greedy episodes of a saved policy, on envs built from the config stored in the checkpoint,
    or from ``config`` (see :func:`zmqrl.checkpoints.policy.checkpoint_config`: a stored
    ``env.id`` / ``agent.kind`` that names code to import needs ``trust_config``), with
    ``overrides`` (e.g. ``env.kwargs``) applied last. Episode i resets with ``seed + i``.

    With ``video_dir`` every episode is recorded to ``video_dir/eval-episode-<i>.mp4``
    (``result.videos``); the episodes are then played one after another in a single rendering env
    rather than in lockstep, same seeds."""
    from zmqrl.checkpoints.files import load_checkpoint
    from zmqrl.checkpoints.policy import checkpoint_config, load_checkpoint_weights, make_eval_agent
    from zmqrl.envs.factory import make_env

    if video_dir is not None:
        require_video_support()
    payload = load_checkpoint(path)
    cfg = checkpoint_config(payload, path, config, overrides, trust_config)
    kind = payload.get("agent_kind", cfg.agent.kind)
    if kind != cfg.agent.kind:
        raise ValueError(f"{path}: weights of a '{kind}' agent, but the config asks for '{cfg.agent.kind}'")
    if video_dir is None:
        envs = [make_env(cfg.env, training=False) for _ in range(episodes)]
    else:
        envs = [_recording_env(cfg.env, video_dir)]
    try:
        agent = make_eval_agent(cfg, envs[0])
        load_checkpoint_weights(agent, payload, path)
        if video_dir is None:
            return evaluate(agent, envs, seed=seed)
        try:
            played = [evaluate(agent, envs, seed=seed + i) for i in range(episodes)]
        except gym.error.DependencyNotInstalled as exc:  # e.g. classic-control envs draw with pygame
            raise VideoUnavailable(f"cannot render {cfg.env.id} for video: {exc}") from None
    finally:
        for env in envs:
            env.close()  # RecordVideo writes the last episode's file here
    returns = [r for result in played for r in result.returns]
    lengths = [n for result in played for n in result.lengths]
    videos = tuple(video_dir / f"{VIDEO_PREFIX}-episode-{i}.mp4" for i in range(episodes))
    return EvalResult(
        float(np.mean(returns)),
        float(np.std(returns)),
        returns,
        lengths,
        tuple(v for v in videos if v.is_file()),
    )


def _recording_env(env_cfg: EnvConfig, video_dir: Path) -> gym.Env[Any, Any]:
    """The evaluation-flavour env, rendering RGB frames, wrapped to record every episode."""
    from gymnasium.wrappers import RecordVideo

    from zmqrl.envs.factory import make_env

    # Frames are drawn off-screen: keep pygame-based renderers from looking for a display (and
    # printing "error: XDG_RUNTIME_DIR is invalid" on headless machines).
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    rendering = dataclasses.replace(env_cfg, kwargs={**env_cfg.kwargs, "render_mode": "rgb_array"})
    return RecordVideo(
        make_env(rendering, training=False),
        str(video_dir),
        episode_trigger=lambda _: True,
        name_prefix=VIDEO_PREFIX,
    )
