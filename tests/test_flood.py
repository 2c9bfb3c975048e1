"""A real learner process flooded on its samples port stays alive and its memory stays bounded.

The test process pushes samples messages at a `zmqrl learner` subprocess as fast as ZeroMQ lets it
for FLOOD_SECONDS: valid CartPole batches (which fill replay, so the learner trains during the
flood) mixed with malformed ones (random bytes, ~1 MB frames, truncated frames, NaN rewards, ...).
Backpressure is expected: sends are non-blocking, and a full queue only makes the flood wait a
few milliseconds. The learner's resident memory is sampled every second from /proc.

Run locally with a shorter flood: ``ZMQRL_FLOOD_SECONDS=15 pytest tests/test_flood.py -s``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq

from tests import run_state
from tests.conftest import processes_mentioning, tiny_overrides
from zmqrl.runtime.health import HealthRecord
from zmqrl.transport import wire
from zmqrl.transport.wire import SamplesMsg, StopMsg
from zmqrl.types import EpisodeStat, TransitionBatch

# A stress test of minutes of real processes: part of the heavy run (`pytest -m heavy`, in CI).
pytestmark = [pytest.mark.slow, pytest.mark.heavy]
REPO = Path(__file__).resolve().parents[1]

# How long the flood lasts. The committed run is a full minute; shorten it only while iterating.
FLOOD_SECONDS = float(os.environ.get("ZMQRL_FLOOD_SECONDS", "60"))
# By then replay is full (capacity rows written once), the queues have reached their high-water
# marks and the allocator its working set, so later growth would be a leak.
WARMUP_SECONDS = min(10.0, FLOOD_SECONDS / 2)
# Bound on RSS growth after warm-up (the learner with its intake process, which receives and decodes).
# Everything the flood can make the learner hold is bounded:
#   * the samples PULL queue: SAMPLES_HWM messages x the largest message we send (~1 MiB), 16 MiB,
#     plus one message being read by ZeroMQ's I/O thread and one being decoded (2 MiB);
#   * replay: preallocated, REPLAY_CAPACITY x 48 B (~1 MiB), and fully written during warm-up;
#   * the learner's other state (episode and lag deques with maxlen, a fixed network, TensorBoard
#     buffers flushed every 5 s) does not scale with the flood.
# That is ~20 MiB at worst, plus allocator slack for freed ~1 MiB buffers. After warm-up a 60 s
# flood sends a few hundred thousand messages, so a leak of a few hundred bytes per message (or a
# single retained ~1 MiB message per second) crosses 64 MiB.
RSS_GROWTH_LIMIT_MB = 64
SAMPLES_HWM = 16
REPLAY_CAPACITY = 20_000

ROWS = 64  # rows per valid batch, like an actor's send_batch
BIG = 2**20  # "oversized" malformed messages carry about this many bytes
SEND_POLL_MS = 5  # a blocked flood waits this long for room before trying again
STARTUP_TIMEOUT = 60.0
# A learner's RSS has settled (its start-up allocations are done) once it held within SETTLED_MB over
# SETTLED_BEATS of its heartbeats (tiny_overrides: one every 0.2 s).
SETTLED_MB, SETTLED_BEATS = 1.0, 5
STOP_TIMEOUT = 30.0


# ---------------------------------------------------------------------------------------------
# The messages: mostly pools built once, so the flood spends its time sending, not generating
# ---------------------------------------------------------------------------------------------


def cartpole_batch(rng: np.random.Generator, rows: int = ROWS) -> TransitionBatch:
    return TransitionBatch(
        obs=rng.uniform(-0.4, 0.4, (rows, 4)).astype(np.float32),  # inside CartPole's bounds
        action=rng.integers(0, 2, rows).astype(np.int64),
        reward=rng.standard_normal(rows).astype(np.float32),
        next_obs=rng.uniform(-0.4, 0.4, (rows, 4)).astype(np.float32),
        discount=np.where(rng.random(rows) < 0.05, 0.0, 0.99**3).astype(np.float32),
    )


def frames_of(msg: wire.Message) -> list[bytes]:
    return [bytes(f) for f in wire.dump(msg)]


def samples(rng: np.random.Generator, seq: int, batch: TransitionBatch | None = None) -> list[bytes]:
    episodes = [EpisodeStat(float(rng.integers(8, 500)), int(rng.integers(8, 500)))] if seq % 4 == 0 else []
    # Version 0 (the initial weights): a stamp above the newest published is refused as bad, and
    # the flood may start before the learner's first publish.
    return frames_of(SamplesMsg(0, seq, 0, batch if batch is not None else cartpole_batch(rng), episodes))


def with_header(frames: list[bytes], **changes: object) -> list[bytes]:
    header = msgpack.unpackb(frames[0])
    header.update(changes)
    return [msgpack.packb(header), *frames[1:]]


def valid_pool(rng: np.random.Generator) -> list[list[bytes]]:
    return [samples(rng, seq) for seq in range(64)]


def small_malformed_pool(rng: np.random.Generator) -> list[list[bytes]]:
    """Malformed messages of up to a few KB, every one of which a learner must refuse."""
    pool: list[list[bytes]] = []
    for i in range(40):
        good = samples(rng, i)
        batch = cartpole_batch(rng)
        row = int(rng.integers(ROWS))
        nan_reward, bad_action = batch.reward.copy(), batch.action.copy()
        nan_reward[row] = [np.nan, np.inf, -np.inf][i % 3]
        bad_action[row] = [2, -1, 2**40][i % 3]
        pool += [
            [rng.bytes(int(rng.integers(0, 300)))],  # random bytes
            [rng.bytes(int(rng.integers(1, 64))) for _ in range(int(rng.integers(2, 8)))],
            [good[0][: int(rng.integers(0, len(good[0])))], *good[1:]],  # truncated header
            [*good[:-1], good[-1][: int(rng.integers(0, len(good[-1])))]],  # truncated last frame
            good[:-1],  # a frame missing
            [*good, good[-1]],  # a frame too many
            with_header(good, proto=2),
            frames_of(StopMsg("not samples")),
            samples(rng, i, batch._replace(reward=nan_reward)),
            samples(rng, i, batch._replace(action=bad_action)),
            samples(rng, i, batch._replace(discount=np.full(ROWS, 1.5, np.float32))),
            samples(rng, i, batch._replace(obs=batch.obs.astype(np.float64))),
        ]
    return pool


def oversized_pool(rng: np.random.Generator) -> list[list[bytes]]:
    """Malformed messages of about 1 MiB: the most a queued message can cost the learner here."""
    good = samples(rng, 0)
    # Well-formed 1 MiB batches (48 B per CartPole row) that a learner could take but for one bad
    # value in their last row, found only by scanning the whole column.
    rows = BIG // 48
    big = cartpole_batch(rng, rows)
    bad_action, nan_reward = big.action.copy(), big.reward.copy()
    bad_action[-1], nan_reward[-1] = 2, np.nan
    return [
        [rng.bytes(BIG)],  # one huge "header"
        [good[0], good[1] + rng.bytes(BIG), *good[2:]],  # obs frame longer than its descriptor
        [*good, rng.bytes(BIG)],  # an extra huge frame
        [good[0], *(rng.bytes(BIG // 5) for _ in range(5))],  # every frame the wrong length
        samples(rng, 1, big._replace(action=bad_action)),
        samples(rng, 2, big._replace(reward=nan_reward)),
    ]


def fresh_malformed(rng: np.random.Generator, template: list[bytes]) -> list[bytes]:
    """A malformed message never sent before, so its rejection reason is new too: random bytes,
    or a samples message of a protocol version drawn at random."""
    if rng.random() < 0.5:
        return [rng.bytes(int(rng.integers(1, 200)))]
    return with_header(template, proto=int(rng.integers(2, 2**62)))


Source = Callable[[int], list[bytes]]


def cycling(pool: list[list[bytes]]) -> Source:
    return lambda i: pool[i % len(pool)]


@dataclass
class Flood:
    """What was offered to the learner's samples socket."""

    sent: dict[str, int] = field(default_factory=lambda: {"valid": 0, "malformed": 0, "oversized": 0})
    blocked: int = 0  # send attempts refused because the learner's queue was full (then retried)
    bytes_sent: int = 0

    @property
    def messages(self) -> int:
        return sum(self.sent.values())

    def try_send(self, sock: zmq.Socket, kind: str, frames: list[bytes]) -> bool:
        """One non-blocking send; on a full queue wait up to SEND_POLL_MS for room and say so."""
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.blocked += 1
            sock.poll(SEND_POLL_MS, zmq.POLLOUT)
            return False
        self.sent[kind] += 1
        self.bytes_sent += sum(len(f) for f in frames)
        return True


# ---------------------------------------------------------------------------------------------
# The learner process
# ---------------------------------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it (from /proc/PID/task/*/children)."""
    tree, at = [pid], 0
    while at < len(tree):
        for children in Path(f"/proc/{tree[at]}/task").glob("*/children"):
            with contextlib.suppress(FileNotFoundError):  # the thread or process ended meanwhile
                tree += [int(child) for child in children.read_text().split()]
        at += 1
    return tree


def rss_mb(pid: int) -> float:
    """Resident set size in MiB of the learner ``pid`` with its child processes, from each one's
    /proc/PID/status (VmRSS, kB): the learner's intake process is what receives, holds and decodes
    the samples a flood sends, so a leak there is the learner's. Pages the two share count twice,
    which moves the level, not its growth."""
    total_kb = 0
    tree = process_tree(pid)
    assert len(tree) >= 2, f"the learner {pid} has no intake process to measure: {tree}"
    for member in tree:
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except FileNotFoundError:
            continue
        match = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.MULTILINE)
        total_kb += int(match.group(1)) if match else 0  # a zombie has no VmRSS
    return total_kb / 1024


def start_learner(
    run_root: Path, stderr_path: Path, stdout_path: Path, **extra: object
) -> subprocess.Popen[bytes]:
    settings: dict[str, object] = {
        "learner__max_updates": 10**9,
        "learner__min_replay_size": 500,
        "learner__eval_interval": 0,  # evaluation only at the end: the flood is what is measured
        "replay__capacity": REPLAY_CAPACITY,
        "transport__samples_hwm": SAMPLES_HWM,
    }
    overrides = tiny_overrides(run_root, **{**settings, **extra})
    cmd = [sys.executable, "-m", "zmqrl", "learner", str(REPO / "configs" / "cartpole_dqn.yaml")]
    for item in overrides:
        cmd += ["--set", item]
    env = {k: v for k, v in os.environ.items() if k != "ZMQRL_SUPERVISED"}  # a learner run by hand
    env = run_state.with_health_file(health_file(stderr_path), env)
    with stderr_path.open("wb") as err, stdout_path.open("wb") as out:
        return subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=err, env={**env, "PYTHONUNBUFFERED": "1"})


def health_file(stderr_path: Path) -> Path:
    return stderr_path.with_suffix(".health.json")


def wait_for_samples_endpoint(proc: subprocess.Popen[bytes], stderr_path: Path) -> str:
    """The endpoint the learner really bound (port 0 asked the OS), from its health file."""
    try:
        return run_state.wait_for_endpoints(health_file(stderr_path), STARTUP_TIMEOUT, proc)["samples"]
    except AssertionError as exc:
        raise AssertionError(f"{exc}; its log:\n{stderr_path.read_text(errors='replace')}") from None


def settled_rss(proc: subprocess.Popen[bytes], stderr_path: Path) -> float:
    """The learner's RSS (MiB) once its start-up allocations are behind it: its main loop runs
    (its health file says so) and its RSS held within SETTLED_MB over SETTLED_BEATS heartbeats,
    each one a round of that loop later than the one before."""
    rss: list[float] = []
    seen = [-1]  # the main-loop progress of the last beat sampled

    def settled(record: HealthRecord) -> bool:
        if record.state not in run_state.WORKING or record.progress == seen[0]:
            return False
        seen[0] = record.progress
        rss.append(rss_mb(proc.pid))
        recent = rss[-SETTLED_BEATS:]
        return len(recent) == SETTLED_BEATS and max(recent) - min(recent) < SETTLED_MB

    try:
        run_state.wait_for_health(
            health_file(stderr_path), settled, STARTUP_TIMEOUT, "the learner's RSS to settle", proc
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}; RSS MiB at its beats: {rss[-20:]}") from None
    return rss[-1]


def stop(proc: subprocess.Popen[bytes]) -> int | None:
    """SIGTERM, then SIGKILL if it does not leave in time; returns the SIGTERM exit code (or None)."""
    if proc.poll() is not None:
        return proc.returncode
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=STOP_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
        return None


def assert_nothing_left(text: str) -> None:
    deadline = time.monotonic() + 5
    while processes_mentioning(text) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_mentioning(text) == [], "the learner (or a child) outlived the test"


# ---------------------------------------------------------------------------------------------
# The test
# ---------------------------------------------------------------------------------------------


def test_learner_memory_stays_bounded_and_it_keeps_training_under_a_samples_flood(
    run_root: Path, tmp_path: Path
) -> None:
    rng = np.random.default_rng(0)
    pool = cycling(small_malformed_pool(rng))
    template = samples(rng, 0)
    kinds: dict[str, Source] = {
        "valid": cycling(valid_pool(rng)),
        "malformed": lambda i: fresh_malformed(rng, template) if i % 4 == 0 else pool(i),
        "oversized": cycling(oversized_pool(rng)),
    }
    names = list(kinds)
    mix = np.array([0.45, 0.50, 0.05])  # oversized ones dominate the bytes anyway
    stderr_path = tmp_path / "learner.err"
    proc = start_learner(run_root, stderr_path, tmp_path / "learner.out")
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDHWM, 64)
    push.setsockopt(zmq.IMMEDIATE, 1)
    flood = Flood()
    rss: list[tuple[float, float]] = []  # (seconds since the flood began, MiB)
    died_at: float | None = None
    try:
        push.connect(wait_for_samples_endpoint(proc, stderr_path))
        rss_start = rss_mb(proc.pid)
        started = time.monotonic()
        next_sample = started
        choices = rng.choice(len(names), size=100_000, p=mix)
        i = 0
        pending: tuple[str, list[bytes]] | None = None
        while (now := time.monotonic()) - started < FLOOD_SECONDS:
            if now >= next_sample:
                next_sample += 1.0
                if proc.poll() is not None:
                    died_at = now - started
                    break
                rss.append((now - started, rss_mb(proc.pid)))
            if pending is None:
                kind = names[choices[i % len(choices)]]
                pending = (kind, kinds[kind](i))
                i += 1
            if flood.try_send(push, *pending):
                pending = None
        alive_at_end = proc.poll() is None
        if alive_at_end:
            rss.append((time.monotonic() - started, rss_mb(proc.pid)))
        push.close(linger=0)
        code = stop(proc)
        stats_path = run_root / "t" / "learner-stats.json"
        stats = json.loads(stats_path.read_text()) if stats_path.exists() else {}
    finally:
        push.close(linger=0)
        ctx.term()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        assert_nothing_left(str(run_root))

    log_tail = stderr_path.read_text(errors="replace")[-3000:]
    assert died_at is None and alive_at_end, f"learner died {died_at} s into the flood:\n{log_tail}"
    # A clean stop: a role run by hand exits 0 after SIGTERM today; 143 (docs/fault-tolerance.md
    # "Exit codes") is accepted too, so this test does not pin which.
    assert code in (0, 128 + signal.SIGTERM), f"learner exited with {code} after SIGTERM:\n{log_tail}"

    warm = next(mb for t, mb in rss if t >= WARMUP_SECONDS)
    after_warm = [mb for t, mb in rss if t >= WARMUP_SECONDS]
    end = rss[-1][1]
    growth, peak_growth = end - warm, max(after_warm) - warm
    mb_sent = flood.bytes_sent / 2**20
    print(
        f"\nflood of {FLOOD_SECONDS:.0f} s: {flood.messages} messages ({flood.sent}), "
        f"{mb_sent:.0f} MiB sent, {flood.blocked} sends blocked (backpressure)\n"
        f"learner and intake RSS: start {rss_start:.1f} MiB, "
        f"after {WARMUP_SECONDS:.0f} s warm-up {warm:.1f} MiB, "
        f"end {end:.1f} MiB, growth {growth:+.1f} MiB "
        f"(peak {peak_growth:+.1f}, limit {RSS_GROWTH_LIMIT_MB})\n"
        f"learner stats: samples {stats.get('samples')}, batches {stats.get('batches')}, "
        f"bad_messages {stats.get('bad_messages')}, updates {stats.get('updates')}, "
        f"replay {stats.get('replay_size')}"
    )
    print("RSS MiB each second:", " ".join(f"{mb:.0f}" for _, mb in rss))

    assert growth < RSS_GROWTH_LIMIT_MB, f"RSS grew {growth:.1f} MiB after warm-up"
    assert peak_growth < RSS_GROWTH_LIMIT_MB, f"RSS peaked {peak_growth:.1f} MiB above its warm-up level"
    assert stats, f"no learner-stats.json after SIGTERM:\n{log_tail}"
    assert stats["state"] == "stopped"
    malformed_sent = flood.sent["malformed"] + flood.sent["oversized"]
    assert 0 < stats["bad_messages"] <= malformed_sent, "malformed messages were not (all) counted as bad"
    assert 0 < stats["samples"] <= ROWS * flood.sent["valid"], "valid batches did not reach replay"
    assert stats["samples"] % ROWS == 0, "a malformed message's rows reached replay"
    assert stats["replay_size"] == REPLAY_CAPACITY
    assert stats["updates"] > 0, "the learner did not train during the flood"


# ---------------------------------------------------------------------------------------------
# Many-frame messages (issue 23 item 8)
# ---------------------------------------------------------------------------------------------

# The message of the issue: 161 frames of 512 KiB (80 MiB), each frame under a 1 MiB limit.
BOMB_FRAMES, BOMB_FRAME_KIB, BOMB_LIMIT_MB = 161, 512, 1
BOMB_SECONDS = 15.0


def test_a_learner_keeps_no_copy_of_the_many_frame_messages_it_refuses(
    run_root: Path, tmp_path: Path
) -> None:
    """libzmq holds a whole multipart message before its first frame is readable, so a learner's
    memory grows by the message it is receiving whatever zmqrl does; what zmqrl must not add is a
    copy of it. Before the frame-by-frame receive, recv_multipart copied each 80 MiB message into
    Python first (measured: +162 MiB peak for one sender, twice the message); now +81."""
    stderr_path = tmp_path / "learner.err"
    proc = start_learner(
        run_root, stderr_path, tmp_path / "learner.out", transport__max_message_mb=BOMB_LIMIT_MB
    )
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.setsockopt(zmq.SNDHWM, 2)
    message_mb = BOMB_FRAMES * BOMB_FRAME_KIB / 1024
    frames = [msgpack.packb({"proto": 1, "kind": "samples"})]
    frames += [zmq.Frame(b"x" * (BOMB_FRAME_KIB * 1024))] * (BOMB_FRAMES - 1)
    sent = 0
    try:
        push.connect(wait_for_samples_endpoint(proc, stderr_path))
        base = peak = settled_rss(proc, stderr_path)
        started = time.monotonic()
        next_sample = started
        while time.monotonic() - started < BOMB_SECONDS:
            if time.monotonic() >= next_sample:
                next_sample += 0.05
                peak = max(peak, rss_mb(proc.pid))
            try:
                push.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                sent += 1
            except zmq.Again:
                push.poll(SEND_POLL_MS, zmq.POLLOUT)
        assert proc.poll() is None, stderr_path.read_text()[-3000:]
        push.close(linger=0)
        stop(proc)
        stats = json.loads((run_root / "t" / "learner-stats.json").read_text())
    finally:
        push.close(linger=0)
        ctx.term()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        assert_nothing_left(str(run_root))
    growth = peak - base
    print(f"\n{sent} messages of {message_mb:.0f} MiB: RSS {base:.0f} -> {peak:.0f} MiB (+{growth:.0f})")
    assert sent >= 3 and stats["bad_messages"] >= 3, "the flood did not get through"
    assert stats["samples"] == 0
    assert growth < 1.5 * message_mb, f"+{growth:.0f} MiB: more than the one message libzmq holds"
