"""The grouped receive (queued messages decoded one by one, their contents scanned once merged)
accepts and drops exactly what the per-message decoder does, for the same reasons, on streams that
mix valid messages of several layouts with hostile ones (broken frames, forged headers, bad
values)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import msgpack
import numpy as np
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.channels import BadMessages, SampleReceiver
from zmqrl.transport.messages import SamplesMsg
from zmqrl.types import EpisodeStat, TransitionBatch

SPEC = SampleSpec(
    obs_shape=(4,),
    obs_dtype="float32",
    action_shape=(),
    action_dtype="int64",
    num_actions=2,
    obs_low=(-1.0, -1.0, -1.0, -1.0),
    obs_high=(1.0, 1.0, 1.0, 1.0),
)
# Per-frame size limit of the receiving socket: a 64-row message (3 KiB of arrays) is too large.
MAX_MESSAGE_BYTES = 2048

Frames = list[bytes]


class Reasons(BadMessages):
    """A tally that also keeps every drop's reason."""

    def __init__(self) -> None:
        super().__init__("samples")
        self.reasons: list[str] = []

    def record(self, error: Exception) -> None:
        self.reasons.append(str(error))
        super().record(error)


def valid(
    seq: int, actor: int = 0, n: int = 8, episodes: int = 0, priorities: bool = False, **bad: float
) -> Frames:
    obs = np.linspace(-0.5, 0.5, n * 4, dtype=np.float32).reshape(n, 4) + np.float32(seq % 3) / 10
    obs[0, 1] = bad.get("obs", obs[0, 1])
    action = np.arange(n, dtype=np.int64) % 2
    action[-1] = int(bad.get("action", action[-1]))
    reward = np.full(n, bad.get("reward", 1.0), np.float32)
    batch = TransitionBatch(obs, action, reward, obs[::-1].copy(), np.full(n, 0.9, np.float32))
    prio = np.full(n, 0.5, np.float32) if priorities else None
    eps = [EpisodeStat(bad.get("ret", 10.0), 10)] * episodes
    return [bytes(f) for f in wire.dump(SamplesMsg(actor, seq, 0, batch, eps, prio))]


def _header(frames: Frames, change: Callable[[dict], None]) -> Frames:
    header = msgpack.unpackb(frames[0])
    change(header)
    return [msgpack.packb(header), *frames[1:]]


def _float_dim(h: dict) -> None:
    h["arrays"][0]["shape"] = [float(d) for d in h["arrays"][0]["shape"]]


def _entries(frames: Frames, entries: list[tuple[str, object]]) -> Frames:
    """The header written entry by entry as a map of 7 (duplicate keys kept, as bytes allow)."""
    assert len(entries) == 7
    packed = b"".join(msgpack.packb(k) + msgpack.packb(v) for k, v in entries)
    return [b"\x87" + packed, *frames[1:]]


def _arrays_first(frames: Frames) -> Frames:
    """Valid, but not as zmqrl's encoder orders it: the fast path's tail does not match."""
    entries = list(msgpack.unpackb(frames[0]).items())
    return _entries(frames, [entries[-1], *entries[:-1]])


def _arrays_twice(frames: Frames) -> Frames:
    """ "episodes" replaced by a second "arrays": the known tail still ends the header."""
    entries = [("arrays", []) if k == "episodes" else (k, v) for k, v in msgpack.unpackb(frames[0]).items()]
    return _entries(frames, entries)


# Ways to break a valid message; each takes its frames and returns the frames sent.
BREAKS: dict[str, Callable[[Frames], Frames]] = {
    "none": lambda f: f,
    "frame missing": lambda f: f[:-1],
    "frame extra": lambda f: [*f, b"\0" * 32],
    "many frames": lambda f: [*f, b"", b"", b""],
    "frame short": lambda f: [*f[:2], f[2][:-8], *f[3:]],
    "frame long": lambda f: [*f[:2], f[2] + b"\0" * 8, *f[3:]],
    "garbage header": lambda f: [b"\xc1not msgpack", *f[1:]],
    "float dimension": lambda f: _header(f, _float_dim),
    "bool seq": lambda f: _header(f, lambda h: h.__setitem__("seq", True)),
    "negative actor": lambda f: _header(f, lambda h: h.__setitem__("actor_id", -1)),
    "extra key": lambda f: _header(f, lambda h: h.__setitem__("x", 1)),
    "rollouts kind": lambda f: _header(f, lambda h: h.__setitem__("kind", "rollouts")),
    "bad episode": lambda f: _header(f, lambda h: h.__setitem__("episodes", [["x", 1]])),
    "arrays first": _arrays_first,
    "arrays twice": _arrays_twice,
    "map16 header": lambda f: [b"\xde\x00\x07" + f[0][1:], *f[1:]],
    "empty header": lambda f: [b"", *f[1:]],
}
VALUES = st.sampled_from(
    [{}, {}, {}, {}, {}, {}, {"reward": float("nan")}, {"action": 5}, {"obs": 3.0}, {"ret": 1e12}]
)
MESSAGES = st.tuples(
    st.integers(0, 2),  # actor
    st.sampled_from([4, 8, 8, 64]),  # rows (64: over the socket's size limit)
    st.integers(0, 2),  # episodes
    st.booleans(),  # priorities
    VALUES,
    st.sampled_from(["none"] * 16 + sorted(BREAKS)),  # mostly intact: groups of several
)


def _receive(stream: list[Frames], grouped: bool, limit: int) -> tuple[list[tuple], list[str], dict]:
    """Send ``stream`` over inproc, read it all one way; the accepted messages (ids and bytes),
    the drop reasons and the sequence accounting."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    try:
        pull.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
        pull.setsockopt(zmq.RCVHWM, 0)
        push.setsockopt(zmq.SNDHWM, 0)
        pull.bind("inproc://stream")
        push.connect("inproc://stream")
        for frames in stream:
            push.send_multipart(frames)
        receiver = SampleReceiver(pull, SPEC, Reasons())
        accepted: list[SamplesMsg] = []
        while True:
            if grouped:
                group = receiver.recv_group(limit)
                if group is None and not pull.poll(0):
                    break
                if group is not None:
                    assert group.size == sum(m.batch.size for m in group.messages)
                    accepted.extend(group.messages)
            else:
                msg = receiver.recv_nowait()
                if msg is False:
                    break
                if isinstance(msg, SamplesMsg):
                    accepted.append(msg)
        ids = [
            (
                m.actor_id,
                m.seq,
                m.weights_version,
                list(m.episodes),
                *(np.asarray(c).tobytes() for c in m.batch),
                None if m.priorities is None else m.priorities.tobytes(),
            )
            for m in accepted
        ]
        bad = receiver.bad
        assert isinstance(bad, Reasons) and bad.count == len(bad.reasons)
        return ids, bad.reasons, receiver.seqs.per_actor()
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(MESSAGES, min_size=1, max_size=40), st.sampled_from([1, 4, 16]))
def test_grouped_receive_accepts_and_drops_what_the_per_message_path_does(
    messages: list[tuple], limit: int
) -> None:
    stream = []
    for seq, (actor, rows, episodes, priorities, values, broken) in enumerate(messages):
        stream.append(BREAKS[broken](valid(seq, actor, rows, episodes, priorities, **values)))
    one, one_reasons, one_seqs = _receive(stream, grouped=False, limit=limit)
    many, many_reasons, many_seqs = _receive(stream, grouped=True, limit=limit)
    assert many == one
    assert Counter(many_reasons) == Counter(one_reasons)
    assert many_seqs == one_seqs


def test_a_stream_of_one_layout_is_read_whole_in_groups() -> None:
    """The common case: a run's messages of one layout are read in groups, every one accepted,
    each message's rows a view of the group's merged columns."""
    stream = [valid(i // 2, actor=i % 2, episodes=i % 3) for i in range(40)]
    ids, reasons, seqs = _receive(stream, grouped=True, limit=16)
    assert not reasons and [(i[0], i[1]) for i in ids] == [(i % 2, i // 2) for i in range(40)]
    assert [len(i[3]) for i in ids] == [i % 3 for i in range(40)]
    for actor in (0, 1):
        assert seqs[actor] | {"last_seq": 19} == {**seqs[actor], "batches": 20, "samples": 160, "lost": 0}
