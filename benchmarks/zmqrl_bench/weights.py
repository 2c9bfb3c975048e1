"""Weights latency: from ``publish`` in the learner to the weights applied in an actor's policy.

The subscriber is a spawned process, as an actor is. *Ours* goes through the real
``WeightsPublisher`` (encode, PUB socket as ``sockets.weights_pub`` makes it) and, on the other
side, the real ``WeightsSubscriber`` (drain, decode, fingerprint check, validation) and the
actor's load path, ``WeightsClient.offer`` into ``policy.load_weights`` (the numpy
policy for the CartPole MLP; the CPU torch agent for the Nature CNN, as actors of that config
use). The *reference* sends the very same bytes over a plain pyzmq PUB/SUB pair and stops the
clock when they are received. Each measurement is one message with nothing queued (lockstep,
ours and reference alternating), timed on ``time.monotonic``, which on Linux is one clock for
every process. The time an actor takes to look (``actor.weights_poll_steps`` env steps between
checks) is not included: it is the actor's choice, not transport.
"""

from __future__ import annotations

import multiprocessing as mp
import sys
import time
from dataclasses import dataclass
from multiprocessing.synchronize import Event as EventType
from pathlib import Path

import numpy as np
import zmq

from zmqrl.config import load_config
from zmqrl.spec import SampleSpec
from zmqrl_bench.actor import CARTPOLE, CONFIGS
from zmqrl_bench.report import BenchSettings, Comparison, Stat

SECONDS = (15, 10)
# How long a spawned subscriber may take to start (a torch import on a busy machine).
START_TIMEOUT = 120.0
# Longest wait for one message's report before the benchmark gives up.
REPORT_TIMEOUT_MS = 10_000
# Pause between messages, so each one meets an idle subscriber.
GAP_SECONDS = 0.005


@dataclass(frozen=True)
class Network:
    """One network to publish: its config, and the observation its spec is built for."""

    label: str
    config: Path
    obs_shape: tuple[int, ...]
    obs_dtype: str
    n_actions: int
    messages: tuple[int, int]  # per repeat and side (full, quick)


NETWORKS = (
    Network("CartPole MLP 128x128", CARTPOLE, (4,), "float32", 2, (40, 15)),
    Network("Nature CNN (Pong)", CONFIGS / "pong_dqn.yaml", (4, 84, 84), "uint8", 6, (15, 6)),
)


def _spec(net: Network) -> SampleSpec:

    return SampleSpec(net.obs_shape, net.obs_dtype, (), "int64", num_actions=net.n_actions)


def _subscribe(net: Network, ours_ep: str, raw_ep: str, report_ep: str, stop: EventType) -> None:
    """The actor side (a spawned process): report, per message received, its kind, version,
    receive time and applied time (monotonic seconds) as plain text frames."""
    import logging

    from zmqrl.agents import make_policy
    from zmqrl.runtime.link import socket_limits
    from zmqrl.runtime.run_fingerprint import run_fingerprint
    from zmqrl.transport import sockets
    from zmqrl.transport.channels import BadMessages, WeightsSubscriber
    from zmqrl.transport.weights_channel import WeightsClient

    cfg = load_config(net.config)
    spec = _spec(net)
    policy = make_policy(cfg.agent, spec, seed=0)
    if "torch" in sys.modules:  # as an actor with a torch policy runs: one intra-op thread
        sys.modules["torch"].set_num_threads(1)
    ctx = zmq.Context()
    ours = sockets.weights_sub(ctx, ours_ep, socket_limits(cfg))
    raw = ctx.socket(zmq.SUB)
    raw.setsockopt(zmq.SUBSCRIBE, b"")
    raw.connect(raw_ep)
    report = ctx.socket(zmq.PUSH)
    report.connect(report_ep)
    subscriber = WeightsSubscriber(
        ours,
        None,
        BadMessages("bench weights", logging.getLogger("zmqrl_bench")),
        expected_fingerprint=run_fingerprint(cfg, spec),
    )
    client = WeightsClient(policy, subscriber.bad)
    poller = zmq.Poller()
    poller.register(ours, zmq.POLLIN)
    poller.register(raw, zmq.POLLIN)
    report.send_multipart([b"ready"])
    try:
        while not stop.is_set():
            for sock, _ in poller.poll(100):
                received = time.monotonic()
                if sock is ours:
                    msg = subscriber.latest()
                    if msg is None:
                        continue
                    client.offer(msg.weights)
                    version = msg.weights.version
                else:
                    raw.recv_multipart()
                    version = 0
                done = time.monotonic()
                kind = b"ours" if sock is ours else b"raw"
                report.send_multipart([kind, b"%d" % version, repr(received).encode(), repr(done).encode()])
            if subscriber.bad.count:
                report.send_multipart([b"bad", str(subscriber.bad.count).encode()])
                return
    finally:
        for sock in (ours, raw, report):
            sock.close(0)
        ctx.term()


class Publisher:
    """The learner side, and a subscriber process connected to it."""

    def __init__(self, ctx: zmq.Context, net: Network) -> None:
        from zmqrl.agents.configs import DQNConfig
        from zmqrl.agents.layers import dqn_net
        from zmqrl.runtime.link import socket_limits
        from zmqrl.runtime.run_fingerprint import run_fingerprint
        from zmqrl.transport import sockets, wire
        from zmqrl.transport.channels import WeightsPublisher
        from zmqrl.transport.wire import WeightsMsg
        from zmqrl.types import Weights

        cfg = load_config(net.config)
        spec = _spec(net)
        rng = np.random.default_rng(0)
        assert isinstance(cfg.agent, DQNConfig), f"{net.config} is not a DQN config"
        agent = cfg.agent
        layout = dqn_net(agent.torso, agent.hidden_sizes, net.n_actions, agent.dueling).layout(net.obs_shape)
        self.arrays = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in layout.items()}
        self.weights_cls = Weights
        fingerprint = run_fingerprint(cfg, spec)
        self.sock, ours_ep = sockets.weights_pub(ctx, "tcp://127.0.0.1:0", socket_limits(cfg))
        self.publisher = WeightsPublisher(self.sock, cfg.agent.kind, fingerprint=fingerprint)
        msg = WeightsMsg(Weights(1, self.arrays), cfg.agent.kind, fingerprint)
        self.raw_frames = [bytes(f) for f in wire.dump(msg)]
        self.bytes = sum(len(f) for f in self.raw_frames)
        self.raw = ctx.socket(zmq.PUB)
        self.raw.setsockopt(zmq.LINGER, 0)
        self.raw.bind("tcp://127.0.0.1:0")
        self.reports = ctx.socket(zmq.PULL)
        self.reports.setsockopt(zmq.LINGER, 0)
        self.reports.bind("tcp://127.0.0.1:0")
        self.version = 0
        spawn = mp.get_context("spawn")
        self._stop = spawn.Event()
        endpoints = [s.getsockopt_string(zmq.LAST_ENDPOINT) for s in (self.raw, self.reports)]
        self.proc = spawn.Process(
            target=_subscribe, args=(net, ours_ep, *endpoints, self._stop), daemon=True, name="bench-sub"
        )

    def start(self) -> None:
        self.proc.start()
        if not self.reports.poll(int(START_TIMEOUT * 1000)):
            raise RuntimeError(f"the benchmark's weights subscriber did not start within {START_TIMEOUT:g} s")
        self.reports.recv_multipart()
        # PUB/SUB drops what is sent before a subscription arrives: repeat until each side is heard.
        self.version = 1
        for send, kind in ((self._send_ours, b"ours"), (self._send_raw, b"raw")):
            deadline = time.monotonic() + 30
            while not self._heard(kind, 50):
                if time.monotonic() > deadline:
                    raise RuntimeError("the benchmark's weights subscriber never received a message")
                send()
        while self.reports.poll(100):  # answers to the repeats
            self.reports.recv_multipart()

    def _send_ours(self) -> None:
        self.publisher.publish(self.weights_cls(self.version, self.arrays))

    def _send_raw(self) -> None:
        self.raw.send_multipart(self.raw_frames, copy=False)

    def _heard(self, kind: bytes, timeout_ms: int) -> bool:
        while self.reports.poll(timeout_ms):
            frames = self.reports.recv_multipart()
            if frames[0] == b"bad":
                raise RuntimeError(f"the subscriber dropped {frames[1].decode()} benchmark weights messages")
            if frames[0] == kind:
                return True
        return False

    def _report(self, kind: bytes, version: int) -> float:
        """The applied (or received) time of message ``version`` of ``kind``."""
        while True:
            if not self.reports.poll(REPORT_TIMEOUT_MS):
                raise RuntimeError(f"no report from the weights subscriber within {REPORT_TIMEOUT_MS} ms")
            frames = self.reports.recv_multipart()
            if frames[0] == b"bad":
                raise RuntimeError(f"the subscriber dropped {frames[1].decode()} benchmark weights messages")
            if frames[0] == kind and (kind == b"raw" or int(frames[1]) == version):
                return float(frames[3])

    def ours(self) -> float:
        """Seconds from ``publish`` of a new version to its import in the subscriber."""
        self.version += 1
        weights = self.weights_cls(self.version, self.arrays)
        sent = time.monotonic()
        self.publisher.publish(weights)
        return self._report(b"ours", self.version) - sent

    def reference(self) -> float:
        sent = time.monotonic()
        self.raw.send_multipart(self.raw_frames, copy=False)
        return self._report(b"raw", 0) - sent

    def close(self) -> None:
        self._stop.set()
        if self.proc.pid is not None:
            self.proc.join(timeout=5)
            if self.proc.is_alive():
                self.proc.kill()
                self.proc.join()
        for sock in (self.sock, self.raw, self.reports):
            sock.close(0)


def run(settings: BenchSettings) -> list[Comparison]:
    ctx = zmq.Context()
    results = []
    try:
        for net in NETWORKS:
            count = net.messages[1 if settings.quick else 0]
            p50: tuple[list[float], list[float]] = ([], [])
            p95: tuple[list[float], list[float]] = ([], [])
            side = Publisher(ctx, net)
            try:
                side.start()
                for _ in range(settings.repeats):
                    ours, raw = [], []
                    for _ in range(count):  # alternating, message by message
                        ours.append(side.ours() * 1000)
                        time.sleep(GAP_SECONDS)
                        raw.append(side.reference() * 1000)
                        time.sleep(GAP_SECONDS)
                    for stats, q in ((p50, 50), (p95, 95)):
                        stats[0].append(float(np.percentile(ours, q)))
                        stats[1].append(float(np.percentile(raw, q)))
            finally:
                side.close()
            for label, (ours_q, raw_q) in (("p50", p50), ("p95", p95)):
                results.append(
                    Comparison(
                        group="weights",
                        name=f"{net.label}, publish to applied, {label}",
                        unit="ms",
                        ours=Stat.of(ours_q),
                        reference=Stat.of(raw_q),
                        target=2.0 if label == "p95" else None,
                        higher_is_better=False,
                        notes="WeightsPublisher -> WeightsSubscriber + load_weights in a spawned "
                        "process vs raw PUB/SUB of the same bytes",
                        extra={"message_bytes": float(side.bytes), "messages_per_repeat": float(count)},
                    )
                )
    finally:
        ctx.term()
    return results
