"""Actor throughput: the real actor (zmqrl/actor/main.py) against the bare env-and-policy loop.

*Ours* is the actor command as ``zmqrl launch`` starts it (its own process, one BLAS
thread), configured from configs/cartpole_dqn.yaml, uncapped, pushing to a learner-side PULL
socket in this process that a thread reads and discards (with the supervisor's two sockets bound
here too). Its rate is the actor's own count of env transitions, read from two of its heartbeats
a window apart, after its first batch went out; its CPU seconds per 1,000 env steps come from
/proc over the same window. The *reference* steps the same env with the same numpy policy's
forward pass at the same epsilon and the same vectorization, in a child process with one BLAS
thread as the actor has (benchmarks/zmqrl_bench/acting.py), and does nothing else: no n-step windows, no
batches, no encoding, no socket. What the ratio leaves out is exactly what zmqrl adds to acting.

The actor ran on a thread of this process until 2026-12-02: there it shared one GIL with the
thread draining its messages, which a real actor never does (the learner is another process),
and the bench charged that to the actor (0.52x then).

Epsilon annealing is switched off on both sides: fully random steps skip the forward pass, and
the point is to compare equal work.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from zmqrl.config import Config, save_config
from zmqrl.runtime.link import PARENT_PID_ENV, SUPERVISED_ENV
from zmqrl.supervisor.processes import role_command
from zmqrl_bench.acting import CARTPOLE as CARTPOLE
from zmqrl_bench.acting import CONFIGS as CONFIGS
from zmqrl_bench.acting import actor_config, actor_like_env, measure_in_child
from zmqrl_bench.cpu import per_thousand, process_cpu_seconds
from zmqrl_bench.report import BenchSettings, Comparison, Stat

# The real actor's rate against the bare loop's that issue 27 asks for.
TARGET = 0.8
# About how long the part takes (full, quick), for the progress line.
SECONDS = (55, 12)
# The actor's measured window starts this long after its first batch went out.
WARMUP_SECONDS = 0.2
# Longest wait for an actor's first batch (it waits for the greeting on the weights channel).
FIRST_BATCH_TIMEOUT = 30.0
# The measured actor's heartbeats (its step counts) come this often, in seconds.
HEARTBEAT_SECONDS = 0.1


class FakeLearnerSide:
    """What an actor talks to, bound on loopback in this process: the samples PULL (drained and
    discarded by a thread, as fast as it can), the weights PUB (one greeting: the run's
    fingerprint, so the actor starts sending), and the supervisor's heartbeat PULL (the newest
    heartbeat's time and step count kept) and control PUB."""

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
        self.beat: tuple[float, float] | None = None  # (sender's time, its steps) of the newest heartbeat
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
                    else:
                        self._note_heartbeat(frames)

    def _note_heartbeat(self, frames: list[Any]) -> None:
        from zmqrl.transport import wire
        from zmqrl.transport.wire import HeartbeatMsg

        msg = wire.load(frames)
        if isinstance(msg, HeartbeatMsg) and "steps" in msg.counters:
            self.beat = (msg.time, float(msg.counters["steps"]))

    def beat_after(self, moment: float, timeout: float = 10.0) -> tuple[float, float]:
        """The first heartbeat sent after wall-clock time ``moment``: (its time, the actor's steps)."""
        deadline = time.monotonic() + timeout
        while (beat := self.beat) is None or beat[0] <= moment:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the benchmark actor sent no heartbeat within {timeout:g} s")
            time.sleep(HEARTBEAT_SECONDS / 4)
        return beat

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for sock in (self.samples, self.weights, self.heartbeat, self.control):
            sock.close(0)


def greeting(cfg: Config) -> list[bytes]:
    """A learner's first weights message to this actor: version 0 (never loaded) and the run's
    fingerprint, which is what the actor waits for before sending."""
    from zmqrl.agents import make_learner
    from zmqrl.envs.factory import make_env, sample_spec
    from zmqrl.runtime.run_fingerprint import run_fingerprint
    from zmqrl.transport import wire
    from zmqrl.transport.wire import WeightsMsg
    from zmqrl.types import Weights

    env = make_env(cfg.env)
    spec = sample_spec(env)
    env.close()
    exported = make_learner(cfg.agent, spec, device="cpu").export_weights()
    arrays = {name: np.zeros_like(array) for name, array in exported.items()}
    msg = WeightsMsg(Weights(0, arrays), cfg.agent.kind, run_fingerprint(cfg, spec))
    return [bytes(f) for f in wire.dump(msg)]


def measure_actor(ctx: zmq.Context, envs: int, seconds: float) -> tuple[float, dict[str, float]]:
    """Env transitions per second of one real actor process over ``seconds`` (after its first batch)."""
    side = FakeLearnerSide(ctx)
    proc: subprocess.Popen[bytes] | None = None
    with tempfile.TemporaryDirectory(prefix="zmqrl-bench-actor-") as tmp:
        cfg = actor_config(
            envs, f"run.dir={tmp}", f"supervisor.heartbeat_interval={HEARTBEAT_SECONDS}", **side.endpoints()
        )
        config_path = Path(tmp) / "actor.yaml"
        save_config(cfg, config_path)
        log_path = Path(tmp) / "actor.log"
        command = role_command("actor", 0, config_path, replacement=False, resume=False)
        try:
            proc = start_actor(command, log_path)
            hello = greeting(cfg)
            deadline = time.monotonic() + FIRST_BATCH_TIMEOUT
            while side.messages == 0:  # PUB drops what is sent before the actor subscribed: repeat
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the benchmark actor sent nothing (exit code {proc.poll()}):\n{_tail(log_path)}"
                    )
                side.weights.send_multipart(hello)
                time.sleep(0.02)
            t0, steps0 = side.beat_after(time.time() + WARMUP_SECONDS)
            bytes0, cpu0 = side.bytes, process_cpu_seconds(proc.pid)
            t1, steps1 = side.beat_after(t0 + seconds)
            bytes1, cpu1 = side.bytes, process_cpu_seconds(proc.pid)
        finally:
            if proc is not None:
                _stop(proc)
            side.close()
    extra = {"bytes_per_s": (bytes1 - bytes0) / (t1 - t0)}
    cost = per_thousand(cpu1 - cpu0, steps1 - steps0) if cpu0 is not None and cpu1 is not None else None
    if cost is not None:  # the heartbeats and /proc are read a moment apart: close, not exact
        extra["cpu_s_per_1k_steps"] = cost
    return (steps1 - steps0) / (t1 - t0), extra


def start_actor(command: list[str], log_path: Path) -> subprocess.Popen[bytes]:
    """The actor as ``zmqrl launch`` starts it (one BLAS thread, the same BLAS kernels; dies with
    this process), except that it does not watch for a supervisor's heartbeats: this bench sends
    none."""
    env = {**actor_like_env(), PARENT_PID_ENV: str(os.getpid())}
    env.pop(SUPERVISED_ENV, None)
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
        )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM (the actor stops cleanly), SIGKILL if it has not within 10 s."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _versus_bare(name: str, measured: list[float], bare: list[float], notes: str, **more: Any) -> Comparison:
    return Comparison("actor", name, "transitions/s", Stat.of(measured), Stat.of(bare), notes=notes, **more)


def run(settings: BenchSettings) -> list[Comparison]:
    """Per vectorization (the config's one env, and in a full run four sub-envs): the real actor
    process against the bare loop, and the acting code alone against it (for one env also without
    the initial priorities of prioritized replay)."""
    window = settings.seconds * 0.6 if not settings.quick else settings.seconds
    variants = (1,) if settings.quick else (1, 4)
    ctx = zmq.Context()
    results = []
    try:
        for envs in variants:
            ours: list[float] = []
            alone: list[float] = []
            unprioritized: list[float] = []
            bare: list[float] = []
            extra: dict[str, float] = {}
            plural = f"{envs} env{'s' if envs > 1 else ''}"
            for _ in range(settings.repeats):  # interleaved: every side sees the same machine
                rate, extra = measure_actor(ctx, envs, window)
                ours.append(rate)
                rates = measure_in_child(envs, window)
                alone.append(rates["sampler"])
                if envs == 1:
                    unprioritized.append(rates["unprioritized"])
                bare.append(rates["bare"])
            results.append(
                _versus_bare(
                    f"CartPole DQN, {plural} per actor, uncapped",
                    ours,
                    bare,
                    "real Actor pushing to a PULL socket vs the bare env + numpy policy loop",
                    target=TARGET,
                    extra=extra,
                )
            )
            results.append(
                _versus_bare(
                    f"same, {plural}: acting code alone (as the actor: PER priorities too), no socket",
                    alone,
                    bare,
                    "Sampler + wire.dump vs the bare loop, in one child with one BLAS thread",
                )
            )
            if unprioritized:
                results.append(
                    _versus_bare(
                        f"same, {plural}: acting code alone, without PER's initial priorities",
                        unprioritized,
                        bare,
                        "as above, without the per-batch priority pass a prioritized config adds",
                    )
                )
    finally:
        ctx.term()
    return results
