"""Actor throughput: the real actor (zmqrl/roles/actor.py) against the bare env-and-policy loop.

*Ours* is an :class:`~zmqrl.roles.actor.Actor` built from configs/cartpole_dqn.yaml, uncapped,
run on a thread of this process as the role tests run it, pushing to a learner-side PULL socket
that a second thread reads and discards (with the supervisor's two sockets bound here too, so
heartbeats go somewhere). Its rate is the actor's own count of env transitions over a window
after its first batch went out. The *reference* steps the same env with the same numpy policy's
forward pass at the same epsilon and the same vectorization, and does nothing else: no n-step
windows, no batches, no encoding, no socket. What the ratio leaves out is exactly what zmqrl
adds to acting.

Epsilon annealing is switched off on both sides: fully random steps skip the forward pass, and
the point is to compare equal work.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.bench.report import BenchSettings, Comparison, Stat
from zmqrl.config import Config, load_config

# Repository configs the benchmarks measure (the bench runs from a checkout).
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CARTPOLE = CONFIGS / "cartpole_dqn.yaml"
# About how long the part takes (full, quick), for the progress line.
SECONDS = (30, 6)
# Steps of the bare loop between clock reads.
CLOCK_EVERY = 64
# Each measured window starts this long after its side is running (first batch out, caches warm).
WARMUP_SECONDS = 0.2
# Longest wait for an actor's first batch (it waits for the greeting on the weights channel).
FIRST_BATCH_TIMEOUT = 30.0


def actor_config(envs_per_actor: int, **endpoints: str) -> Config:
    """The CartPole DQN config, uncapped, without epsilon annealing, on ``endpoints``."""
    overrides = [
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


class FakeLearnerSide:
    """What an actor talks to, bound on loopback in this process: the samples PULL (drained and
    discarded by a thread, as fast as it can), the weights PUB (one greeting: the run's
    fingerprint, so the actor starts sending), and the supervisor's heartbeat PULL and control PUB."""

    def __init__(self, ctx: zmq.Context) -> None:
        self.samples = ctx.socket(zmq.PULL)
        self.weights = ctx.socket(zmq.PUB)
        self.heartbeat = ctx.socket(zmq.PULL)
        self.control = ctx.socket(zmq.PUB)
        for sock in (self.samples, self.weights, self.heartbeat, self.control):
            sock.setsockopt(zmq.LINGER, 0)
            sock.bind("tcp://127.0.0.1:0")
        self.messages = 0
        self.bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drain, name="bench-pull", daemon=True)
        self._thread.start()

    def endpoints(self) -> dict[str, str]:
        names = ("samples", "weights", "heartbeat", "control")
        return {name: getattr(self, name).getsockopt_string(zmq.LAST_ENDPOINT) for name in names}

    def _drain(self) -> None:
        poller = zmq.Poller()
        poller.register(self.samples, zmq.POLLIN)
        poller.register(self.heartbeat, zmq.POLLIN)
        while not self._stop.is_set():
            for sock, _ in poller.poll(100):
                while True:
                    try:
                        frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    if sock is self.samples:
                        self.messages += 1
                        self.bytes += sum(len(f) for f in frames)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in (self.samples, self.weights, self.heartbeat, self.control):
            sock.close(0)


def greeting(cfg: Config) -> list[bytes]:
    """A learner's first weights message to this actor: version 0 (never loaded) and the run's
    fingerprint, which is what the actor waits for before sending."""
    from zmqrl.agents import make_policy
    from zmqrl.envs import make_env, sample_spec
    from zmqrl.fingerprint import run_fingerprint
    from zmqrl.transport import wire
    from zmqrl.transport.wire import WeightsMsg
    from zmqrl.types import Weights

    env = make_env(cfg.env)
    spec = sample_spec(env)
    env.close()
    policy = make_policy(cfg.agent, spec)
    arrays = {name: np.zeros(shape, dtype) for name, (shape, dtype) in policy.weights_spec().items()}
    msg = WeightsMsg(Weights(0, arrays), cfg.agent.kind, run_fingerprint(cfg, spec))
    return [bytes(f) for f in wire.dump(msg)]


def measure_actor(ctx: zmq.Context, envs: int, seconds: float) -> tuple[float, dict[str, float]]:
    """Env transitions per second of one real actor over ``seconds`` (after its first batch)."""
    from zmqrl.roles.actor import Actor

    side = FakeLearnerSide(ctx)
    cfg = actor_config(envs, **side.endpoints())
    actor = Actor(cfg, 0, ctx=ctx)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            actor.run()
        except BaseException as exc:  # reported by the caller, with its traceback
            errors.append(exc)

    thread = threading.Thread(target=run, name="bench-actor", daemon=True)
    threads = _torch_threads()
    thread.start()
    try:
        hello = greeting(cfg)
        deadline = time.monotonic() + FIRST_BATCH_TIMEOUT
        while side.messages == 0:  # PUB drops what is sent before the actor subscribed: repeat
            if errors:
                raise errors[0]
            if time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark actor sent nothing within {FIRST_BATCH_TIMEOUT:g} s")
            side.weights.send_multipart(hello)
            time.sleep(0.02)
        time.sleep(WARMUP_SECONDS)
        steps0, bytes0, t0 = actor.steps, side.bytes, time.perf_counter()
        time.sleep(seconds)
        steps1, bytes1, t1 = actor.steps, side.bytes, time.perf_counter()
    finally:
        actor.request_stop()
        thread.join(timeout=30)
        side.close()
        _restore_torch_threads(threads)
    if errors:
        raise errors[0]
    if thread.is_alive():
        raise RuntimeError("the benchmark actor did not stop within 30 s")
    return (steps1 - steps0) / (t1 - t0), {"bytes_per_s": (bytes1 - bytes0) / (t1 - t0)}


def measure_bare(envs: int, seconds: float) -> float:
    """Env transitions per second of the bare loop: the actor's env and policy, nothing else."""
    from zmqrl.acting import actor_seed, ladder
    from zmqrl.agents import make_policy
    from zmqrl.envs import make_env, make_vector_env, sample_spec

    cfg = actor_config(envs)
    env: Any = make_env(cfg.env) if envs == 1 else make_vector_env(cfg.env, envs, training=True)
    spec = sample_spec(env)
    policy = make_policy(cfg.agent, spec, seed=actor_seed(cfg, 0))
    epsilons = ladder(cfg, 0)
    policy.epsilon = float(epsilons[0]) if envs == 1 else epsilons
    seed = actor_seed(cfg, 0)
    step = _single_loop(policy, env, seed) if envs == 1 else _vector_loop(policy, env, envs, seed)
    try:
        end = time.perf_counter() + WARMUP_SECONDS
        while time.perf_counter() < end:
            step()
        steps, t0 = 0, time.perf_counter()
        end = t0 + seconds
        while (now := time.perf_counter()) < end:
            steps += step()
        return steps / (now - t0)
    finally:
        env.close()


def _single_loop(policy: Any, env: Any, seed: int) -> Callable[[], int]:
    obs = env.reset(seed=seed)[0]

    def step() -> int:
        nonlocal obs
        for _ in range(CLOCK_EVERY):
            action = policy.act(obs[None], explore=True)[0]
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                obs = env.reset()[0]
        return CLOCK_EVERY

    return step


def _vector_loop(policy: Any, env: Any, envs: int, seed: int) -> Callable[[], int]:
    obs = env.reset(seed=[seed + j for j in range(envs)])[0]
    resetting = np.zeros(envs, bool)  # rows in their NEXT_STEP autoreset step are not transitions

    def step() -> int:
        nonlocal obs, resetting
        real = 0
        for _ in range(CLOCK_EVERY // envs or 1):
            actions = policy.act(obs, explore=True)
            obs, _, terminated, truncated, _ = env.step(actions)
            real += envs - int(resetting.sum())
            resetting = terminated | truncated
        return real

    return step


def _torch_threads() -> int | None:
    """The actor sets torch to one thread when torch is loaded: remember this process's setting."""
    return sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None


def _restore_torch_threads(threads: int | None) -> None:
    if threads is not None:
        sys.modules["torch"].set_num_threads(threads)


def run(settings: BenchSettings) -> list[Comparison]:
    """One row per vectorization: the config's one env, and (full run) four sub-envs."""
    window = settings.seconds * 0.6 if not settings.quick else settings.seconds
    variants = (1,) if settings.quick else (1, 4)
    ctx = zmq.Context()
    results = []
    try:
        for envs in variants:
            ours: list[float] = []
            bare: list[float] = []
            extra: dict[str, float] = {}
            for _ in range(settings.repeats):  # interleaved: both sides see the same machine
                rate, extra = measure_actor(ctx, envs, window)
                ours.append(rate)
                bare.append(measure_bare(envs, window))
            results.append(
                Comparison(
                    group="actor",
                    name=f"CartPole DQN, {envs} env{'s' if envs > 1 else ''} per actor, uncapped",
                    unit="transitions/s",
                    ours=Stat.of(ours),
                    reference=Stat.of(bare),
                    target=0.9,
                    notes="real Actor pushing to a PULL socket vs the bare env + numpy policy loop",
                    extra=extra,
                )
            )
    finally:
        ctx.term()
    return results
