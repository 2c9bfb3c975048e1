"""Queued samples messages are received as a group: one content scan and one replay add for all
of them, while each message still counts (and fails) on its own."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import zmq

from tests.conftest import wait_until
from zmqrl.config import ReplayConfig
from zmqrl.learner.ingest import INGEST_GROUP_MESSAGES, Ingest, LearnerCounters, group_limit
from zmqrl.replay import NoLimit, RateLimiter, make_replay
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.channels import BadMessages, SampleReceiver
from zmqrl.transport.messages import SamplesMsg
from zmqrl.transport.sample_channel import SampleGroup
from zmqrl.types import EpisodeStat, TransitionBatch

SPEC = SampleSpec(obs_shape=(4,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=2)


def message(
    seq: int, n: int = 8, actor: int = 0, version: int = 0, priorities: bool = False, **bad: float
) -> SamplesMsg:
    obs = np.full((n, 4), float(seq), np.float32)
    reward = np.full(n, bad.get("reward", 1.0), np.float32)
    batch = TransitionBatch(obs, np.zeros(n, np.int64), reward, obs + 1, np.full(n, 0.9, np.float32))
    prio = np.full(n, 0.5, np.float32) if priorities else None
    return SamplesMsg(actor, seq, version, batch, episodes=[EpisodeStat(10.0, 10)], priorities=prio)


@pytest.fixture
def link() -> Iterator[tuple[zmq.Socket, SampleReceiver]]:
    """A PUSH/PULL pair over inproc: a sent message is queued at the receiver when send returns,
    so the tests know exactly what a group can take."""
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    pull.bind("inproc://samples")
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect("inproc://samples")
    receiver = SampleReceiver(pull, SPEC, BadMessages("samples"))
    yield push, receiver
    push.close(0)
    pull.close(0)
    ctx.term()


def send(push: zmq.Socket, *msgs: SamplesMsg) -> None:
    for msg in msgs:
        push.send_multipart(wire.dump(msg))


def recv_all(receiver: SampleReceiver, limit: int = INGEST_GROUP_MESSAGES) -> list[SampleGroup]:
    groups: list[SampleGroup] = []
    while (group := receiver.recv_group(limit)) is not None:
        groups.append(group)
    return groups


def test_a_group_merges_rows_in_the_order_received() -> None:
    group = SampleGroup.of([message(1, n=3), message(2, n=5)])
    assert group.size == 8 and [m.seq for m in group.messages] == [1, 2]
    assert group.batch.obs[:3].max() == 1.0 and group.batch.obs[3:].min() == 2.0
    assert group.priorities is None


def test_a_group_of_one_copies_nothing() -> None:
    msg = message(1)
    assert SampleGroup.of([msg]).batch is msg.batch


def test_messages_with_and_without_priorities_never_share_a_group() -> None:
    with pytest.raises(ValueError, match="priorities"):
        SampleGroup.of([message(1, priorities=True), message(2)])
    assert SampleGroup.of([message(1, priorities=True), message(2, priorities=True)]).priorities.shape == (
        16,
    )  # type: ignore[union-attr]


def test_queued_messages_arrive_as_groups_and_each_is_tracked(
    link: tuple[zmq.Socket, SampleReceiver],
) -> None:
    push, receiver = link
    send(push, *(message(seq) for seq in range(5)))
    groups = recv_all(receiver, limit=3)
    assert [[m.seq for m in g.messages] for g in groups] == [[0, 1, 2], [3, 4]]
    assert sum(g.size for g in groups) == 40
    assert receiver.seqs.totals()["lost_batches"] == 0
    assert receiver.bad.count == 0


def test_a_bad_message_is_dropped_alone_and_counted(link: tuple[zmq.Socket, SampleReceiver]) -> None:
    push, receiver = link
    send(push, message(0), message(1, reward=float("nan")), message(2))
    groups = recv_all(receiver)
    assert [[m.seq for m in g.messages] for g in groups] == [[0, 2]] and receiver.bad.count == 1
    assert all(np.isfinite(g.batch.reward).all() for g in groups)


def test_a_message_whose_priorities_differ_waits_for_the_next_group(
    link: tuple[zmq.Socket, SampleReceiver],
) -> None:
    push, receiver = link
    send(push, message(0), message(1), message(2, priorities=True), message(3, priorities=True))
    groups = recv_all(receiver)
    assert [[m.seq for m in g.messages] for g in groups] == [[0, 1], [2, 3]]
    assert groups[0].priorities is None and groups[1].priorities is not None


def ingest(limiter: RateLimiter | NoLimit | None = None, max_policy_lag: int | None = None) -> Ingest:
    return Ingest(
        make_replay(ReplayConfig(capacity=1000), SPEC, seed=0),
        limiter or NoLimit(),
        LearnerCounters(),
        spec=SPEC,
        published_version=lambda: 10,
        min_replay_size=1,
        max_policy_lag=max_policy_lag,
    )


def test_a_group_enters_replay_as_one_add_and_counts_every_message() -> None:
    target = ingest()
    adds: list[int] = []
    real_add = target.replay.add
    target.replay.add = lambda batch, priorities=None: (adds.append(batch.size), real_add(batch, priorities))[
        1
    ]  # type: ignore[method-assign]
    assert target.accept_group(SampleGroup.of([message(s) for s in range(4)]))
    assert adds == [32] and len(target.replay) == 32
    c = target.counters
    assert (c.samples, c.batches, c.episodes) == (32, 4, 4)
    assert list(c.lags) == [10, 10, 10, 10]


def test_a_stale_message_in_a_group_is_dropped_and_the_fresh_ones_enter() -> None:
    target = ingest(max_policy_lag=5)
    group = SampleGroup.of([message(0, version=9), message(1, version=2), message(2, version=8)])
    assert target.accept_group(group)
    c = target.counters
    assert len(target.replay) == 16 and c.samples == 16 and c.batches == 2
    assert (c.stale_batches, c.stale_samples) == (1, 8)
    assert c.episodes == 3  # a stale batch's finished episodes still happened


def test_a_batch_stamped_above_the_published_version_is_a_bad_message() -> None:
    """Issue 23 item 11: no actor can hold a version the learner has not published (10 here), so
    such a stamp is forged; counted as unfit input, it cannot pass max_policy_lag with a negative
    lag. The group's other messages still enter."""
    target = ingest(max_policy_lag=5)
    bad = BadMessages("samples")
    group = SampleGroup.of([message(0, version=10), message(1, version=11), message(2, version=2**62)])
    assert target.accept_group(group, bad=bad)
    c = target.counters
    assert bad.count == 2 and len(target.replay) == 8 and c.batches == 1
    assert c.stale_batches == 0 and list(c.lags) == [0] and c.episodes == 1
    assert min(target.counters.recent_lags) >= 0


def test_episode_records_beyond_the_reward_limit_make_a_bad_message(
    link: tuple[zmq.Socket, SampleReceiver],
) -> None:
    """The decoder checks a layout's structure once, but episode returns are values: a return no
    run of this reward limit can have is refused in a message of an already known layout."""
    push, receiver = link
    target = ingest()
    huge = message(1)
    huge.episodes[:] = [EpisodeStat(SPEC.max_abs_reward * 20, 10)]
    send(push, message(0), huge)  # the same layout twice: the second is decoded on the fast path
    received: list[SampleGroup] = []

    def both_read() -> bool:
        if receiver.wait(10) and (group := receiver.recv_group(16)) is not None:
            received.append(group)
        return sum(len(g.messages) for g in received) + receiver.bad.count >= 2

    wait_until(both_read, 10, "both messages read")
    for group in received:
        assert target.accept_group(group, bad=receiver.bad)
    assert receiver.bad.count == 1 and target.counters.batches == 1 and target.counters.episodes == 1
    assert list(target.counters.episode_queue) == [EpisodeStat(10.0, 10)]


@pytest.mark.parametrize(
    ("limiter", "merges"),
    [(NoLimit(), True), (RateLimiter(8.0, 1000, 1), False), (None, True)],
)
def test_ingest_merges_small_rows_only_without_a_replay_ratio(
    limiter: RateLimiter | NoLimit | None, merges: bool
) -> None:
    """The intake's group size (zmqrl/learner/main.py hands it this): several small-row messages
    per group without a ratio; one under a ratio, whose room is at most its tolerance."""
    assert (group_limit(SPEC, limiter) > 1) is merges
    images = SampleSpec(obs_shape=(4, 84, 84), obs_dtype="uint8", action_shape=(), action_dtype="int64")
    assert group_limit(images) == 1, "large rows arrive zero-copy: merging would copy them"


def test_an_admitted_group_waits_for_the_ratio_and_then_goes_in_whole() -> None:
    """What the training loop does between updates (zmqrl/learner/intake.py SampleFeed): a group
    is admitted once, and inserted when the ratio has room; refused, nothing changes."""
    target = ingest(RateLimiter(1.0, 8, 8))  # one sampled row per row inserted, 8 rows either way
    group = SampleGroup.of([message(0, n=8)])
    admitted = target.admit(group)
    assert admitted is not None and target.insert(admitted)  # min_size reached: room for 8 more
    assert target.insert(SampleGroup.of([message(1, n=8)])) is True
    before = (len(target.replay), target.counters.samples)
    assert target.insert(SampleGroup.of([message(2, n=8)])) is False, "ahead of training: held"
    assert (len(target.replay), target.counters.samples) == before
    target.limiter.sampled(16)
    assert target.insert(SampleGroup.of([message(2, n=8)])) is True
