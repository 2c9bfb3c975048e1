"""Learner ingest: samples received, validated and inserted into replay, against raw PUSH/PULL.

Synthetic senders (:mod:`zmqrl_bench.senders`) push valid, pre-encoded samples messages as fast
as the sockets take them. *Ours* is the learner's ingest exactly: its intake process (the learner's
own PULL socket, ``SampleReceiver``'s decode and checks, groups forwarded) and, in this process,
the learner's :class:`~zmqrl.learner.intake.SampleFeed` inserting them into the replay buffer the
config builds, counted by what reached replay. The *reference* reads a PULL socket of its own with
plain pyzmq and throws the bytes away. Every sender is connected to both, and only one side reads
at a time (a side that does not read fills its queue and is dealt no more), so the two share the
same senders, alternately, and every condition but the work done per message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import zmq

from zmqrl.config import Config, load_config
from zmqrl_bench.actor import CARTPOLE, CONFIGS
from zmqrl_bench.report import BenchSettings, Comparison, Stat
from zmqrl_bench.senders import SampleShape, Senders

SECONDS = (30, 10)
# Each window starts this long after its reader does: queued messages (the senders never stop,
# and TCP buffers hold megabytes) are drained first and not counted.
WARMUP_SECONDS = 0.25
# Replay capacity of the Atari-sized case: 4096 rows of two 4x84x84 frames are 230 MB.
ATARI_CAPACITY = 4096
# Synthetic senders per case: the configs' actor count.
SENDERS = 2
# Ingest's share of raw PULL throughput to reach (issue 27), both message sizes.
INGEST_TARGET = 0.7

log = logging.getLogger("zmqrl_bench")


@dataclass(frozen=True)
class Case:
    """One message shape and the config whose transport and replay settings receive it."""

    label: str
    shape: SampleShape
    config: Config


def cases() -> list[Case]:
    cartpole = load_config(CARTPOLE)
    atari = load_config(CONFIGS / "pong_dqn.yaml")
    # Plain uniform replay: synthetic frames do not overlap as stacked frames do (share_frames).
    atari = replace(atari, replay=replace(atari.replay, capacity=ATARI_CAPACITY, share_frames=False))
    cartpole = replace(cartpole, replay=replace(cartpole.replay, prioritized=False))
    # The shipped CartPole config keeps one message queued (it runs under a replay ratio); a
    # flood is measured with the default queues, the setting where ingest has the most to do.
    cartpole = replace(cartpole, transport=replace(cartpole.transport, samples_hwm=64, samples_buffer_kb=0))
    atari = replace(atari, replay=replace(atari.replay, prioritized=False))
    return [
        Case("CartPole-sized (64 x 4 float32)", SampleShape(), cartpole),
        Case("Atari-sized (32 x 4x84x84 uint8)", SampleShape.atari(), atari),
    ]


class IngestSide:
    """The learner's receiving end: ``ours`` feeds replay from an intake process for a window,
    ``raw`` reads and discards from a plain socket for one; each returns transitions per second."""

    def __init__(self, ctx: zmq.Context, case: Case, senders: int) -> None:
        from zmqrl.learner.ingest import Ingest, LearnerCounters, group_limit
        from zmqrl.learner.intake import IntakeProcess, SampleFeed
        from zmqrl.replay import NoLimit, make_replay
        from zmqrl.runtime.link import socket_limits
        from zmqrl.spec import SampleSpec
        from zmqrl.transport import sockets
        from zmqrl.transport.channels import BadMessages

        shape = case.shape
        self.batch = shape.batch
        self.spec = SampleSpec(shape.obs_shape, shape.obs_dtype, (), "int64", num_actions=shape.n_actions)
        transport = replace(case.config.transport, samples="tcp://127.0.0.1:0")
        self.intake = IntakeProcess(ctx, transport, BadMessages("bench ingest", log))
        try:
            self.endpoint = self.intake.bound()
            self.sock, self.raw_endpoint = sockets.samples_pull(
                ctx, "tcp://127.0.0.1:0", socket_limits(case.config)
            )
        except BaseException:
            self.intake.close()
            raise
        self.zero_copy = self.spec.obs_bytes >= 1024  # as SampleReceiver reads (copy or not)
        self.counters = LearnerCounters()
        self.replay = make_replay(case.config.replay, self.spec, seed=0, log=log)
        limiter = NoLimit()
        self.ingest = Ingest(
            self.replay,
            limiter,
            self.counters,
            spec=self.spec,
            published_version=lambda: 0,
            min_replay_size=case.config.learner.min_replay_size,
            max_policy_lag=None,
        )
        self.intake.begin(self.spec, senders, group_limit(self.spec, limiter))
        self.feed = SampleFeed(self.intake, self.ingest)
        self.raw_messages = 0

    def ours(self, seconds: float) -> float:
        def feed() -> None:
            if not self.feed.take():
                self.intake.ready(20)

        def inserted() -> int:
            with self.counters.lock:
                return self.counters.samples

        return _window(feed, inserted, seconds)

    def raw(self, seconds: float) -> float:
        copy = not self.zero_copy  # as the receiver reads: the cheaper way for the size
        sock = self.sock

        def drain() -> None:
            if not sock.poll(20, zmq.POLLIN):
                return
            for _ in range(64):
                try:
                    sock.recv_multipart(zmq.NOBLOCK, copy=copy)
                except zmq.Again:
                    break
                self.raw_messages += 1

        return _window(drain, lambda: self.raw_messages * self.batch, seconds)

    def check(self) -> None:
        """Every message the benchmark made is valid: a drop means it measured the wrong thing."""
        self.intake.read_reports()
        if self.intake.bad.count:
            raise RuntimeError(f"ingest benchmark: {self.intake.bad.count} synthetic messages were dropped")

    def close(self) -> None:
        self.intake.close()
        self.sock.close(0)


def _window(step: Callable[[], None], count: Callable[[], int], seconds: float) -> float:
    """Run ``step()`` over and over (on this thread, as the learner's training thread takes its
    samples); the rate of ``count`` over ``seconds`` after WARMUP_SECONDS."""
    start = time.perf_counter()
    while time.perf_counter() - start < WARMUP_SECONDS:
        step()
    n0, t0 = count(), time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        step()
    n1, t1 = count(), time.perf_counter()
    return (n1 - n0) / (t1 - t0)


def measure(
    ctx: zmq.Context, case: Case, senders: int, repeats: int, seconds: float, reference: bool = True
) -> tuple[list[float], list[float]]:
    """``repeats`` windows of ours and (with ``reference``) raw, interleaved, from ``senders``."""
    side = IngestSide(ctx, case, senders)
    ours: list[float] = []
    raw: list[float] = []
    try:
        endpoints = (side.endpoint, side.raw_endpoint)
        with Senders(endpoints, senders, case.shape, hwm=case.config.transport.samples_hwm):
            for _ in range(repeats):
                ours.append(side.ours(seconds))
                if reference:
                    raw.append(side.raw(seconds))
        side.check()
    finally:
        side.close()
    return ours, raw


def run(settings: BenchSettings) -> list[Comparison]:
    window = settings.seconds / 2
    ctx = zmq.Context()
    results = []
    try:
        for case in cases():
            ours, raw = measure(ctx, case, SENDERS, settings.repeats, window)
            results.append(
                Comparison(
                    group="ingest",
                    name=f"{case.label}, {SENDERS} senders, uniform replay",
                    unit="transitions/s",
                    ours=Stat.of(ours),
                    reference=Stat.of(raw),
                    target=INGEST_TARGET,
                    notes="intake process (receive, decode, check) + SampleFeed into replay vs raw PULL "
                    "receive-and-discard",
                    extra={"message_bytes": float(case.shape.message_bytes)},
                )
            )
    finally:
        ctx.term()
    return results
