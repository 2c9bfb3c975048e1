"""Atari actor throughput: zmqrl's gymnasium pipeline against EnvPool, on one core.

What an actor with ``actor.envs_per_actor`` = N spends its time on is stepping N preprocessed Atari
envs; this measures that loop alone (random actions, no policy), once through the exact envs
zmqrl's actors use (:func:`zmqrl.envs.factory.make_vector_env` with ``env.preprocess: atari``) and once
through EnvPool (C++ envs and preprocessing) configured to the same pipeline, on one thread
(``num_threads=1``, ``batch_size = num_envs``: synchronous, like ``SyncVectorEnv``). The two sides
alternate repeat by repeat so the machine's drift hits both.

Unit: **env frames per second**, i.e. agent steps x ``frame_skip`` (emulator frames, the unit
Atari papers count), per core of wall time. ``extra`` also keeps frames per CPU-second of the
process (all threads), which is the fairer per-core number should EnvPool's worker thread and
the waiting main thread ever overlap.

``ours`` is EnvPool, ``reference`` gymnasium; target 1.5, the bar EnvPool had to clear to be
offered as an ``env.backend``. It did not (about 1.35x, wall and CPU alike, on a shared 2-core
machine; issue 12), so zmqrl has no such option and this row keeps the evidence current.
Without EnvPool installed the list holds one plain row (the gymnasium side only, ``reference``
None, the install line in ``notes``); without ale-py it is empty and the reason is logged.

Same preprocessing means: no-op starts (30), frame skip 4 with a max-pool of the last two frames,
84x84 grey (INTER_AREA), a 4-frame stack, sticky actions 0.25, sign-clipped rewards, no FIRE on
reset, no life-loss terminals, 27,000-step episodes. With sticky actions off and one no-op both
give pixel-identical observations (tests/test_bench_atari.py); the layouts are checked before
measuring. (EnvPool 1.2.5 segfaults on ``noop_max=0``, so never pass it that.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from zmqrl.config import AtariConfig, EnvConfig
from zmqrl_bench.report import BenchSettings, Comparison, Stat

log = logging.getLogger("zmqrl_bench.atari")

GAME = "Pong"  # ALE/Pong-v5 for gymnasium, Pong-v5 for EnvPool: the same ROM and action set
SUB_ENVS = 8  # sub-envs one actor steps (actor.envs_per_actor)
# ALE v5's default (repeat_action_probability=0.25, sticky actions): zmqrl passes it through
# untouched, so EnvPool (whose default is 0) is given the same.
STICKY_ACTIONS = 0.25
# ALE v5 stops an episode after 108,000 emulator frames, i.e. 27,000 agent steps at frame_skip 4.
MAX_EPISODE_FRAMES = 108_000
WARMUP_STEPS = 5  # vector steps before each measurement (caches warm again after the other side)
ACTION_RING = 1024  # pre-drawn random action rows, so drawing actions costs both sides nothing
ENVPOOL_INSTALL = "pip install envpool"

Stepper = Callable[[np.ndarray], Any]


@dataclass
class _Side:
    """One side's stepping function and its measurements."""

    label: str
    step: Stepper
    close: Callable[[], None]
    wall: list[float]
    cpu: list[float]


def run(settings: BenchSettings) -> list[Comparison]:
    """EnvPool vs gymnasium frames/s on one core, ``settings.repeats`` interleaved measurements each."""
    try:
        gym_env = _gymnasium_env(SUB_ENVS)
    except Exception as exc:  # ale-py / opencv missing, or no ROM: nothing to measure at all
        log.warning("atari bench skipped: the gymnasium Atari env cannot be made (%s)", exc)
        return []
    num_actions = int(gym_env.single_action_space.n)
    actions = np.random.default_rng(0).integers(0, num_actions, size=(ACTION_RING, SUB_ENVS))
    sides = [_Side("gymnasium", gym_env.step, gym_env.close, [], [])]
    unavailable = ""
    try:
        pool = envpool_env(SUB_ENVS)
    except ImportError:
        pool, unavailable = None, f"envpool not installed ({ENVPOOL_INSTALL})"
    except Exception as exc:  # e.g. a partial install: envpool's import needs every asset wheel it names
        pool, unavailable = None, f"envpool could not be made ({type(exc).__name__}: {exc})"
    if unavailable:
        log.warning("atari bench: %s; measuring gymnasium only", unavailable)
    layout = ""
    if pool is not None:
        sides.insert(0, _Side("envpool", pool.step, pool.close, [], []))
        layout = _layout_problem(gym_env, pool)
        if layout:
            log.warning("atari bench: the two sides differ in kind: %s", layout)
    frame_skip = AtariConfig().frame_skip
    try:
        for repeat in range(settings.repeats):
            # Alternate which side goes first, so neither always runs on a machine the other warmed.
            order = sides if repeat % 2 == 0 else sides[::-1]
            for side in order:
                wall, cpu = _measure(side.step, actions, settings.seconds, frame_skip)
                side.wall.append(wall)
                side.cpu.append(cpu)
    finally:
        for side in sides:
            side.close()
    return [_comparison(sides, settings, layout, unavailable)]


def _layout_problem(gym_env: Any, pool: Any) -> str:
    """How the two sides' observations or actions differ in kind ("" when they agree), so the row
    never compares unlike work silently."""
    pool_space, ref_space = pool.observation_space, gym_env.single_observation_space
    ours = (tuple(pool_space.shape), np.dtype(pool_space.dtype), int(pool.action_space.n))
    ref = (tuple(ref_space.shape), np.dtype(ref_space.dtype), int(gym_env.single_action_space.n))
    return "" if ours == ref else f"envpool (obs shape, dtype, actions) {ours} != gymnasium {ref}"


def _comparison(sides: list[_Side], settings: BenchSettings, layout: str, unavailable: str) -> Comparison:
    by_label = {side.label: side for side in sides}
    gym_side = by_label["gymnasium"]
    extra = {"sub_envs": float(SUB_ENVS), "gymnasium_cpu_frames_per_s": float(np.median(gym_side.cpu))}
    name = f"{GAME}, {SUB_ENVS} sub-envs, 1 thread, envpool vs gymnasium"
    if "envpool" not in by_label:
        return Comparison(
            group="atari",
            name=f"{GAME}, {SUB_ENVS} sub-envs, gymnasium pipeline only",
            unit="env frames/s",
            ours=Stat.of(gym_side.wall),
            reference=None,
            notes=f"{unavailable}: gymnasium side only",
            extra=extra,
        )
    pool_side = by_label["envpool"]
    extra["envpool_cpu_frames_per_s"] = float(np.median(pool_side.cpu))
    extra["cpu_ratio"] = extra["envpool_cpu_frames_per_s"] / extra["gymnasium_cpu_frames_per_s"]
    return Comparison(
        group="atari",
        name=name,
        unit="env frames/s",
        ours=Stat.of(pool_side.wall),
        reference=Stat.of(gym_side.wall),
        target=1.5,
        notes=(
            "frames = agent steps x frame_skip 4; random actions; same preprocessing both sides "
            f"(noop 30, max-pool, 84x84 grey, stack 4, sticky {STICKY_ACTIONS}, sign rewards); "
            f"{settings.repeats} interleaved repeats of {settings.seconds:g} s"
            + (f"; LAYOUTS DIFFER: {layout}" if layout else "")
        ),
        extra=extra,
    )


def _measure(step: Stepper, actions: np.ndarray, seconds: float, frame_skip: int) -> tuple[float, float]:
    """(wall frames/s, CPU frames/s) of stepping for about ``seconds`` after a short warm-up."""
    rows = len(actions)
    for i in range(WARMUP_STEPS):
        step(actions[i % rows])
    steps = 0
    wall0, cpu0 = time.perf_counter(), time.process_time()
    deadline = wall0 + seconds
    while time.perf_counter() < deadline:  # one vector step is milliseconds: the clock costs nothing
        step(actions[steps % rows])
        steps += 1
    wall = time.perf_counter() - wall0
    cpu = max(time.process_time() - cpu0, 1e-9)
    frames = steps * actions.shape[1] * frame_skip
    return frames / wall, frames / cpu


def _gymnasium_env(num_envs: int) -> Any:
    """The envs a zmqrl actor steps: make_vector_env with the Atari preprocessing, training mode."""
    from zmqrl.envs.factory import make_vector_env

    env: Any = make_vector_env(EnvConfig(id=f"ALE/{GAME}-v5", preprocess="atari"), num_envs, training=True)
    env.reset(seed=list(range(num_envs)))  # a SyncVectorEnv (frames, not a Dict): seeds per sub-env
    return env


def envpool_env(
    num_envs: int, atari: AtariConfig | None = None, *, game: str = GAME, sticky: float = STICKY_ACTIONS
) -> Any:
    """EnvPool's Atari env configured to zmqrl's training pipeline (raises ImportError without it).

    Everything that differs from EnvPool's defaults is set explicitly: no FIRE on reset (gymnasium's
    AtariPreprocessing does not press it), sticky actions as ALE v5, rewards clipped to their sign.
    """
    import envpool

    atari = atari or AtariConfig()
    env = envpool.make(
        f"{game}-v5",
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=num_envs,
        num_threads=1,
        seed=0,
        frame_skip=atari.frame_skip,
        noop_max=atari.noop_max,
        img_height=atari.screen_size,
        img_width=atari.screen_size,
        gray_scale=atari.grayscale,
        stack_num=atari.frame_stack,
        episodic_life=atari.terminal_on_life_loss,
        reward_clip=atari.clip_rewards,
        use_fire_reset=False,
        repeat_action_probability=sticky,
        max_episode_steps=MAX_EPISODE_FRAMES // atari.frame_skip,
    )
    env.reset()
    return env
