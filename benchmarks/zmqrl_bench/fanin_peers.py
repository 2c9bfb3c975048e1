"""Simulated actors for the fan-in benchmark: a few processes, each hosting many actors that look
like real ones to the learner and the supervisor, without stepping an env.

A simulated actor holds what a real actor holds towards the rest of the run: its own samples PUSH
socket, its own weights subscription (SUB), its own heartbeat PUSH signed with the run's actor key,
and its own control subscription, all made by :mod:`zmqrl.transport.sockets` as a real actor makes
them. It sends valid CartPole ``samples`` messages (:func:`zmqrl_bench.senders.sample_batch`, one
batch per actor, re-encoded with a fresh ``seq`` for each message, so the learner's sequence
accounting sees an ordinary stream) and heartbeats every ``supervisor.heartbeat_interval`` under
its own actor id.

Pacing: the actors of one process share one schedule, message ``k`` due at ``start + k / rate`` and
sent by actor ``k mod K``, so each actor sends at ``rate / K`` and the processes together at the
offered rate whatever their number. A message whose socket is full (the learner not taking) is
counted as refused, never queued again: the offered rate is a rate, not a backlog. A process that
falls more than MAX_LAG_SECONDS behind its schedule (a starved CPU) drops the missed slots and
counts them, so it never bursts.

What each subscription sees is recorded as it arrives: for every weights version, the monotonic
time the process woke to find it queued (monotonic time is one clock for every process on Linux).
Only the header is decoded (the version), not the tensors: what a real actor does with weights is
the actor's cost, while what the measurement is after is the learner's fan-out. Control messages
(the supervisor's beats) are drained unread for the same reason.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import queue
import socket as pysocket
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.synchronize import Event as EventType
from multiprocessing.synchronize import Semaphore as SemaphoreType
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import zmq

from zmqrl.transport import sockets, wire
from zmqrl.transport.control import HeartbeatSender
from zmqrl.transport.control_auth import ControlAuth
from zmqrl.transport.control_keys import KeySource
from zmqrl.transport.messages import KIND_WEIGHTS, SamplesMsg
from zmqrl_bench.senders import SampleShape, sample_batch

# The longest a process may fall behind its schedule before it drops the slots it missed.
MAX_LAG_SECONDS = 0.25
# Longest single poll (seconds): the stop event and the heartbeats are looked at least this often.
MAX_POLL_SECONDS = 0.05
# Slots of each process's shared counters: transitions sent, messages refused, messages dropped.
COUNT_SENT_ROWS, COUNT_REFUSED, COUNT_DROPPED = 0, 1, 2
# How long the processes may take to start (imports on a busy machine), and to hand in their reports.
START_TIMEOUT = 120.0
REPORT_TIMEOUT = 30.0


@dataclass(frozen=True)
class PeerPlan:
    """What one process of simulated actors does (plain values: it crosses a spawn)."""

    samples: str  # the learner's samples endpoint
    weights: str  # the learner's weights endpoint
    heartbeat: str  # the supervisor's heartbeat endpoint
    control: str  # the supervisor's control endpoint
    keys_dir: str  # transport.control_keys_dir: the actor key signs the heartbeats
    actor_ids: tuple[int, ...]  # the simulated actors this process hosts
    messages_per_s: float  # this process's share of the offered rate, in samples messages
    heartbeat_interval: float
    limits: sockets.SocketLimits = field(default_factory=sockets.SocketLimits)
    shape: SampleShape = field(default_factory=SampleShape)


@dataclass
class PeerReport:
    """What one process did: its messages, and every first arrival of a weights version at one of
    its subscriptions (``arrival_actor[i]`` saw ``arrival_version[i]`` at ``arrival_time[i]``)."""

    actor_ids: tuple[int, ...]
    sent: int = 0  # samples messages handed to ZeroMQ
    refused: int = 0  # due messages whose socket was full (the learner not taking them)
    dropped: int = 0  # due messages this process was too far behind to send (starved CPU)
    beats: int = 0  # heartbeats sent
    arrival_actor: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    arrival_version: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    arrival_time: np.ndarray = field(default_factory=lambda: np.zeros(0, np.float64))


def weights_version(header_frame: Any) -> int | None:
    """The version a weights message's header names; None for any other message (a stop)."""
    try:
        header = msgpack.unpackb(bytes(header_frame), raw=False)
    except (ValueError, msgpack.ExtraData):
        return None
    if not isinstance(header, dict) or header.get("kind") != KIND_WEIGHTS:
        return None
    version = header.get("version")
    return version if isinstance(version, int) else None


class Schedule:
    """When the next message of a process is due, at ``rate`` messages/s from ``start``."""

    def __init__(self, rate: float, start: float) -> None:
        self.rate = rate
        self.start = start
        self.next = 0  # index of the next message due
        self.dropped = 0

    def due(self, now: float) -> int:
        """How many messages are due at ``now`` (the slots more than MAX_LAG_SECONDS late are
        dropped and counted, not returned)."""
        if self.rate <= 0:
            return 0
        reached = int((now - self.start) * self.rate) + 1  # messages whose time has come
        late = int((now - MAX_LAG_SECONDS - self.start) * self.rate) + 1
        if late > self.next:
            self.dropped += late - self.next
            self.next = late
        due = max(0, reached - self.next)
        self.next += due
        return due

    def wait(self, now: float) -> float:
        """Seconds until the next message is due."""
        if self.rate <= 0:
            return MAX_POLL_SECONDS
        return max(0.0, self.start + self.next / self.rate - now)


class SimulatedActor:
    """One actor's four sockets, its samples stream and its weights arrivals."""

    def __init__(self, ctx: zmq.Context, plan: PeerPlan, actor_id: int, auth: ControlAuth) -> None:
        self.actor_id = actor_id
        self.push = sockets.samples_push(ctx, plan.samples, plan.limits)
        self.sub = sockets.weights_sub(ctx, plan.weights, plan.limits)
        self.beat_sock = sockets.heartbeat_push(ctx, plan.heartbeat, plan.limits)
        self.control = sockets.control_sub(ctx, plan.control, plan.limits)
        self.heartbeat = HeartbeatSender(
            self.beat_sock, "actor", actor_id, plan.heartbeat_interval, auth=auth
        )
        self.batch = sample_batch(plan.shape, seed=actor_id)
        self.rows = plan.shape.batch
        self.seq = 0
        self.version = 0
        self.start_id = uuid.uuid4().hex[:16]
        self.beats = 0
        self.arrivals: list[tuple[int, float]] = []

    def send(self) -> bool:
        """One samples message, without blocking; False if its queue is full."""
        frames = wire.dump(SamplesMsg(self.actor_id, self.seq, self.version, self.batch, episodes=[]))
        try:
            self.push.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        self.seq += 1
        return True

    def take_weights(self, now: float) -> None:
        """Every queued weights message; the first arrival of each newer version is recorded."""
        while int(self.sub.get(zmq.EVENTS)) & zmq.POLLIN:
            try:
                frames = self.sub.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            version = weights_version(frames[0].buffer)
            if version is not None and version > self.version:
                self.version = version
                self.arrivals.append((version, now))

    def drain_control(self) -> None:
        while int(self.control.get(zmq.EVENTS)) & zmq.POLLIN:
            try:
                self.control.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break

    def beat(self, host: str, state: str = "running") -> bool:
        """A heartbeat if one is due (``state`` "stopped": the last one, at once), with counters
        as an actor's: progress grows with every beat, so the supervisor never judges it hung."""
        if state == "running" and not self.heartbeat.due():
            return False
        self.beats += 1
        samples = self.seq * self.rows
        counters = {"progress": self.beats, "work": self.seq, "steps": samples, "samples": samples}
        counters.update(batches=self.seq, weights_version=self.version, bad_control=0)
        self.heartbeat.beat(state, counters, {"host": host, "start": self.start_id})
        return True

    def close(self) -> None:
        """Its sockets; the heartbeat socket lingers (sockets.SocketLimits) for the last beat."""
        for sock in (self.push, self.sub, self.control):
            sock.close(linger=0)
        self.beat_sock.close()


def run_peers(
    plan: PeerPlan,
    stop: EventType,
    ready: SemaphoreType,
    counts: Any,
    results: Any,
) -> None:
    """A process of simulated actors (the target of a spawned process): paced sends, heartbeats and
    weights arrivals until ``stop``; then its :class:`PeerReport` on ``results``. ``counts`` (a
    shared array, this process its only writer) holds, as they happen, the transitions sent and
    the messages refused and dropped (COUNT_SENT_ROWS, COUNT_REFUSED, COUNT_DROPPED), for the
    parent to read over its window."""
    ctx = zmq.Context()
    auth = ControlAuth(KeySource(None, None, Path(plan.keys_dir), role="actor"))
    actors = [SimulatedActor(ctx, plan, actor_id, auth) for actor_id in plan.actor_ids]
    poller = zmq.Poller()
    by_socket: dict[zmq.Socket, tuple[SimulatedActor, bool]] = {}
    for actor in actors:
        for sock, is_weights in ((actor.sub, True), (actor.control, False)):
            poller.register(sock, zmq.POLLIN)
            by_socket[sock] = (actor, is_weights)
    host = pysocket.gethostname()[:64]
    report = PeerReport(plan.actor_ids)
    schedule = Schedule(plan.messages_per_s, time.monotonic())
    turn = 0
    ready.release()
    try:
        while not stop.is_set():
            timeout = min(schedule.wait(time.monotonic()), MAX_POLL_SECONDS)
            events = poller.poll(math.ceil(timeout * 1000))  # never a busy loop before a due send
            now = time.monotonic()
            for sock, _ in events:
                actor, is_weights = by_socket[sock]
                if is_weights:
                    actor.take_weights(now)
                else:
                    actor.drain_control()
            for _ in range(schedule.due(now)):
                actor = actors[turn % len(actors)]
                turn += 1
                if actor.send():
                    report.sent += 1
                    counts[COUNT_SENT_ROWS] += actor.rows
                else:
                    report.refused += 1
                    counts[COUNT_REFUSED] += 1
            counts[COUNT_DROPPED] = schedule.dropped
            report.beats += sum(actor.beat(host) for actor in actors)
    finally:
        report.dropped = schedule.dropped
        pairs = [(actor.actor_id, version, t) for actor in actors for version, t in actor.arrivals]
        if pairs:
            report.arrival_actor = np.array([p[0] for p in pairs], np.int64)
            report.arrival_version = np.array([p[1] for p in pairs], np.int64)
            report.arrival_time = np.array([p[2] for p in pairs], np.float64)
        for actor in actors:
            actor.beat(host, "stopped")  # as a real actor's last beat: the supervisor waits for none
            actor.close()
        ctx.term()
        results.put(report)


class Peers:
    """The processes of simulated actors, one per plan, spawned (no fork of a process holding
    ZeroMQ state) and always ended on the way out, so a failing benchmark leaves none behind."""

    def __init__(self, plans: Sequence[PeerPlan]) -> None:
        ctx = mp.get_context("spawn")
        self._stop = ctx.Event()
        self._ready = ctx.Semaphore(0)
        self._results: Any = ctx.Queue()
        self._counts = [ctx.RawArray("q", 3) for _ in plans]
        self._procs = [
            ctx.Process(
                target=run_peers,
                args=(plan, self._stop, self._ready, sent, self._results),
                name=f"fanin-peers-{i}",
                daemon=True,
            )
            for i, (plan, sent) in enumerate(zip(plans, self._counts, strict=True))
        ]

    @property
    def pids(self) -> list[int]:
        return [proc.pid for proc in self._procs if proc.pid is not None]

    def start(self) -> None:
        """Start every process and wait until each has opened its sockets."""
        for proc in self._procs:
            proc.start()
        deadline = time.monotonic() + START_TIMEOUT
        for _ in self._procs:
            if not self._ready.acquire(timeout=max(0.0, deadline - time.monotonic())):
                self.stop()
                raise RuntimeError(f"the simulated actors did not start within {START_TIMEOUT:g} s")

    def counts(self) -> tuple[int, int, int]:
        """Transitions sent, messages refused and messages dropped so far, all processes together."""
        sent, refused, dropped = (sum(int(c[slot]) for c in self._counts) for slot in range(3))
        return sent, refused, dropped

    def stop(self) -> list[PeerReport]:
        """Stop them; the reports of those that handed one in."""
        self._stop.set()
        reports: list[PeerReport] = []
        deadline = time.monotonic() + REPORT_TIMEOUT
        started = [proc for proc in self._procs if proc.pid is not None]
        while len(reports) < len(started) and time.monotonic() < deadline:
            if not any(proc.is_alive() for proc in started) and self._results.empty():
                break
            try:
                reports.append(self._results.get(timeout=0.2))
            except queue.Empty:
                continue
        for proc in started:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self._results.close()
        self._results.join_thread()
        return reports
