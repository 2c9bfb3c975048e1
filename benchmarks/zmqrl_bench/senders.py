"""Synthetic actors for the benchmarks: processes that push real, valid samples messages as fast
as the socket takes them, so what is measured is the receiving side alone.

Each sender encodes its messages once, before it starts (the learner cannot tell: every message
is valid and carries its own ``seq``), and pushes with the same high-water mark actors use, so a
learner that reads slowly holds its senders back exactly as it holds back real actors.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from typing import Any

import numpy as np
import zmq

from zmqrl.transport import wire
from zmqrl.transport.messages import SamplesMsg
from zmqrl.types import TransitionBatch

# Pre-encoded messages a sender cycles through (distinct seqs within a cycle).
CYCLE = 64
# A paced sender behind its schedule by more than this (held back by its receiver) starts its
# schedule afresh rather than burst to catch up: it offers its rate, never more.
CATCH_UP_SECONDS = 0.05


@dataclass(frozen=True)
class SampleShape:
    """What one synthetic transition looks like (CartPole: (4,) float32 and 2 discrete actions)."""

    obs_shape: tuple[int, ...] = (4,)
    obs_dtype: str = "float32"
    n_actions: int = 2
    batch: int = 64  # transitions per message (actor.send_batch)

    @classmethod
    def atari(cls, batch: int = 32) -> SampleShape:
        return cls(obs_shape=(4, 84, 84), obs_dtype="uint8", n_actions=6, batch=batch)

    @property
    def message_bytes(self) -> int:
        obs = int(np.prod(self.obs_shape)) * np.dtype(self.obs_dtype).itemsize
        return self.batch * (2 * obs + 8 + 4 + 4)


def sample_batch(shape: SampleShape, seed: int = 0) -> TransitionBatch:
    rng = np.random.default_rng(seed)
    if np.dtype(shape.obs_dtype).kind == "u":
        obs = rng.integers(0, 256, size=(shape.batch, *shape.obs_shape), dtype=np.uint8)
    else:
        # Inside CartPole's declared bounds (|angle| <= 0.42): the learner refuses what its env
        # could not have produced, so out-of-bounds rows would measure the drop path instead.
        obs = rng.uniform(-0.4, 0.4, size=(shape.batch, *shape.obs_shape)).astype(shape.obs_dtype)
    return TransitionBatch(
        obs,
        rng.integers(0, shape.n_actions, shape.batch),
        rng.normal(size=shape.batch).astype(np.float32),
        np.roll(obs, 1, axis=0),
        np.full(shape.batch, 0.97, np.float32),
    )


def encoded_messages(shape: SampleShape, actor_id: int, count: int = CYCLE) -> list[list[bytes]]:
    """``count`` valid samples messages of ``actor_id`` with seqs 0..count-1, as frames."""
    batch = sample_batch(shape, seed=actor_id)
    return [
        [bytes(f) for f in wire.dump(SamplesMsg(actor_id, seq, 0, batch, episodes=[]))]
        for seq in range(count)
    ]


def _push(
    endpoints: tuple[str, ...],
    shape: SampleShape,
    actor_id: int,
    hwm: int,
    stop: EventType,
    ready: Any,
    per_second: float | None = None,
) -> None:
    messages = encoded_messages(shape, actor_id)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.LINGER, 0)
    for endpoint in endpoints:  # PUSH deals to the peers whose queue has room
        sock.connect(endpoint)
    ready.release()
    i = 0
    start = time.monotonic()
    try:
        while not stop.is_set():
            if per_second is not None:  # paced: message i is due at start + i / per_second
                ahead = start + i / per_second - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                elif ahead < -CATCH_UP_SECONDS:  # held back: offer the rate from now, no burst
                    start = time.monotonic() - i / per_second
            try:
                sock.send_multipart(messages[i % CYCLE], flags=zmq.NOBLOCK, copy=False)
                i += 1
            except zmq.Again:
                sock.poll(20, zmq.POLLOUT)  # held back by the receiver: exactly what is measured
    finally:
        sock.close(0)
        ctx.term()


class Senders:
    """``count`` sender processes pushing to ``endpoint`` until ``stop()`` (or the with-block ends).

    Given several endpoints, each sender connects to all of them, and ZeroMQ deals its messages to
    whichever has room: a receiver that stops reading fills its queue and gets no more, so two
    receivers read alternately share the same senders.

    Processes are spawned (no fork of a process that holds torch or ZeroMQ state) and always
    terminated on the way out, so a failing benchmark leaves none behind.
    """

    def __init__(
        self,
        endpoint: str | tuple[str, ...],
        count: int,
        shape: SampleShape,
        hwm: int = 64,
        rate: float | None = None,
    ) -> None:
        """``rate``: the transitions/s all of them offer together, paced (None: as fast as the
        sockets take them). A paced sender held back by its receiver does not burst to catch up."""
        endpoints = (endpoint,) if isinstance(endpoint, str) else endpoint
        per_second = None if rate is None else rate / shape.batch / count
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._ready = ctx.Semaphore(0)
        self._procs = [
            ctx.Process(
                target=_push,
                args=(endpoints, shape, i, hwm, self._stop, self._ready, per_second),
                daemon=True,
            )
            for i in range(count)
        ]

    def __enter__(self) -> Senders:
        for proc in self._procs:
            proc.start()
        deadline = time.monotonic() + 60
        for _ in self._procs:  # each has encoded its messages and connected
            if not self._ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self.stop()
                raise RuntimeError("a benchmark sender did not start within 60 s")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        for proc in self._procs:
            if proc.pid is not None:
                proc.join(timeout=5)
                if proc.is_alive():
                    proc.kill()
                    proc.join()
