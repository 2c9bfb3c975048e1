"""The in-process sides of the actor benchmark (benchmarks/zmqrl_bench/actor.py): the bare env-and-policy
loop, and zmqrl's acting code alone (``Sampler`` with each batch encoded, no socket), measured
one after the other in a child process started as an actor is (one BLAS thread; on an AVX-512
CPU, OpenBLAS's AVX2 kernels).

The bare loop steps the actor's env with the actor's numpy policy behind the same epsilon
explorer, at the same vectorization, and does nothing else. Between it and the real actor, the
acting code alone splits what zmqrl's acting costs from what its process, socket and threads
cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.config import Config, load_config
from zmqrl.supervisor.processes import BLAS_THREADS_ENV, small_maths_env

# Repository configs the benchmarks measure (the bench runs from a checkout).
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CARTPOLE = CONFIGS / "cartpole_dqn.yaml"
# Steps of the bare loop between clock reads.
CLOCK_EVERY = 64
# Each measured window starts this long after its side is running (first batch out, caches warm).
WARMUP_SECONDS = 0.2
# Longest a child may take beyond its measured windows (imports, env and policy set-up).
CHILD_SETUP_SECONDS = 30.0


def actor_config(envs_per_actor: int, *extra: str, **endpoints: str) -> Config:
    """The CartPole DQN config, uncapped, without epsilon annealing, on ``endpoints``."""
    overrides = [
        *extra,
        "actor.max_steps_per_s=null",
        # The default queues: the shipped config keeps one message queued for its replay ratio,
        # which paces an actor by the receiver's round trips, not by what acting costs.
        "transport.samples_hwm=64",
        "transport.samples_buffer_kb=0",
        "actor.epsilon_decay_steps=0",
        f"actor.envs_per_actor={envs_per_actor}",
        *(f"transport.{name}={endpoint}" for name, endpoint in endpoints.items()),
    ]
    return load_config(CARTPOLE, overrides)


def _acting_parts(envs: int) -> tuple[Config, Any, Any, Any]:
    """What both in-process sides act with: the config, its env (vectorized for ``envs`` > 1),
    the sample spec and the policy, seeded as actor 0."""
    from zmqrl.actor.sampler import actor_seed
    from zmqrl.agents import make_policy
    from zmqrl.envs.factory import make_env, make_vector_env, sample_spec

    cfg = actor_config(envs)
    env: Any = make_env(cfg.env) if envs == 1 else make_vector_env(cfg.env, envs, training=True)
    spec = sample_spec(env)
    return cfg, env, spec, make_policy(cfg.agent, spec, seed=actor_seed(cfg, 0))


def _steps_per_second(step: Callable[[], int], seconds: float) -> float:
    """The rate of ``step()`` (which returns the env transitions it took) over ``seconds``, after
    WARMUP_SECONDS of it unmeasured."""
    end = time.perf_counter() + WARMUP_SECONDS
    while time.perf_counter() < end:
        step()
    steps, t0 = 0, time.perf_counter()
    end = t0 + seconds
    while (now := time.perf_counter()) < end:
        steps += step()
    return steps / (now - t0)


def measure_bare(envs: int, seconds: float) -> float:
    """Env transitions per second of the bare loop: the actor's env and policy, nothing else."""
    from zmqrl.actor.exploration import EpsilonExplorer
    from zmqrl.actor.sampler import actor_seed, ladder

    cfg, env, spec, policy = _acting_parts(envs)
    epsilons = ladder(cfg, 0)
    seed = actor_seed(cfg, 0)
    explorer = EpsilonExplorer(policy, spec, seed=seed, epsilon=float(epsilons[0]) if envs == 1 else epsilons)
    step = _single_loop(explorer.act, env, seed) if envs == 1 else _vector_loop(explorer.act, env, envs, seed)
    try:
        return _steps_per_second(step, seconds)
    finally:
        env.close()


def measure_sampler(envs: int, seconds: float, priorities: bool = True) -> float:
    """Env transitions per second of the actor's acting code alone: ``Sampler`` (n-step windows,
    batches, epsilon schedule, and with ``priorities`` the Ape-X initial priorities the actor of a
    prioritized-replay config computes per batch) with each ready batch encoded as a samples
    message, in this process, sent nowhere. Between the bare loop and the real actor, it splits
    what zmqrl's acting costs from what its process, socket and threads cost."""
    from zmqrl.actor.parts import build_acting
    from zmqrl.actor.sampler import Collected
    from zmqrl.transport import wire

    parts = build_acting(actor_config(envs, *([] if priorities else ["replay.prioritized=false"])), 0)
    sampler, adder = parts.sampler, parts.adder
    encoded = 0

    def step() -> int:
        nonlocal encoded
        before = sampler.steps
        # Weights due: none to take here. The learner counts as heard: nothing is held back.
        if sampler.collect(CLOCK_EVERY) is Collected.BATCH_READY and (msg := adder.pop()) is not None:
            encoded += len(wire.dump(msg))
        return sampler.steps - before

    try:
        rate = _steps_per_second(step, seconds)
        if not encoded:
            raise RuntimeError("the sampler benchmark encoded no message")
        return rate
    finally:
        sampler.close()


def actor_like_env() -> dict[str, str]:
    """This process's environment with what ``zmqrl launch`` gives an actor's BLAS (one thread
    always; its kernels unless the environment chooses them), for the bench's children."""
    return {**small_maths_env(), **os.environ, BLAS_THREADS_ENV: "1"}


def measure_in_child(envs: int, seconds: float) -> dict[str, float]:
    """The in-process sides (``sampler``; ``unprioritized`` for one env; ``bare``), measured one
    after the other in a child process that, like the actor ``measure_actor`` starts, runs one
    BLAS thread.

    In this process OpenBLAS runs a thread per core (it reads its setting once, when numpy loads),
    and the priority pass's (2B, 128) matrix products woke them for every batch: on a busy 2-core
    machine the acting code alone then measured 0.1-0.4x its bare loop, slower and far noisier
    than the real actor, which never pays that hand-off. The bare loop's one-row products never
    wake them, so it is measured in the same child, right after, for a ratio of equals."""
    code = (
        "import json, sys\n"
        "from zmqrl_bench.acting import child_rates\n"
        "print(json.dumps(child_rates(int(sys.argv[1]), float(sys.argv[2]))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(envs), str(seconds)],
        env=actor_like_env(),
        capture_output=True,
        text=True,
        timeout=CHILD_SETUP_SECONDS + 10 * seconds,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"the in-process actor benchmark failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    rates: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return rates


def child_rates(envs: int, seconds: float) -> dict[str, float]:
    """What ``measure_in_child`` runs in its child: the acting code alone (with priorities and,
    for one env, without), then the bare loop."""
    rates = {"sampler": measure_sampler(envs, seconds)}
    if envs == 1:
        rates["unprioritized"] = measure_sampler(envs, seconds, priorities=False)
    rates["bare"] = measure_bare(envs, seconds)
    return rates


def _single_loop(act: Callable[[np.ndarray], np.ndarray], env: Any, seed: int) -> Callable[[], int]:
    obs = env.reset(seed=seed)[0]

    def step() -> int:
        nonlocal obs
        for _ in range(CLOCK_EVERY):
            action = act(obs[None])[0]
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs = env.reset()[0]
        return CLOCK_EVERY

    return step


def _vector_loop(
    act: Callable[[np.ndarray], np.ndarray], env: Any, envs: int, seed: int
) -> Callable[[], int]:
    obs = env.reset(seed=[seed + j for j in range(envs)])[0]
    resetting = np.zeros(envs, bool)  # rows in their NEXT_STEP autoreset step are not transitions

    def step() -> int:
        nonlocal obs, resetting
        real = 0
        for _ in range(CLOCK_EVERY // envs or 1):
            actions = act(obs)
            obs, _, terminated, truncated, _ = env.step(actions)
            real += envs - int(resetting.sum())
            resetting = terminated | truncated
        return real

    return step
