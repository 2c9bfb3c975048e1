"""What a peer's ``actor_id`` and ``seq`` may do to a live learner: nothing but be counted.

Four well-formed messages used to end the learner at every restart: two actor ids each jumping to
``seq`` 2**63-1 pushed ``lost_batches`` past int64, the learner's own heartbeat refused to encode
it, and the process exited 1. And every id a peer invented got an entry of its own in the
learner's stats.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zmq

from tests.conftest import tiny_config, wait_until
from tests.test_roles import FakeSupervisor, cartpole_batch, start, with_transport
from zmqrl.learner.main import Learner
from zmqrl.transport import wire
from zmqrl.transport.control import carried_counters
from zmqrl.transport.fields import INT64_MAX
from zmqrl.transport.sequence import EXTRA_TRACKED_IDS
from zmqrl.transport.wire import HeartbeatMsg, SamplesMsg

SEQ_MAX = 2**63 - 1  # the largest seq the wire takes


def started_learner(ctx: zmq.Context, tmp_path: Path, sup: FakeSupervisor) -> tuple[Learner, zmq.Socket]:
    cfg = with_transport(
        tiny_config(tmp_path, learner__max_updates=10_000_000, learner__min_replay_size=100),
        **sup.endpoints(),
    )
    learner = Learner(cfg, ctx=ctx)
    thread = start(learner.run)
    learner.thread = thread  # type: ignore[attr-defined]
    assert learner.ready.wait(30)
    # Valid messages say they were acted with version 1, so send once the learner has published it.
    wait_until(lambda: learner.publisher.version >= 1, 10, "the learner's first publish")
    push = ctx.socket(zmq.PUSH)
    push.connect(learner.endpoints["samples"])
    return learner, push


def samples(actor_id: int, seq: int) -> list[bytes | memoryview]:
    return wire.dump(SamplesMsg(actor_id, seq, 1, cartpole_batch(8), []))


def beats_after(sup: FakeSupervisor, n: int) -> list[HeartbeatMsg]:
    return [hb for hb in sup.drain()[n:] if hb.role == "learner"]


def test_four_messages_with_far_sequence_jumps_leave_the_learner_training(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    sup = FakeSupervisor(ctx)
    learner, push = started_learner(ctx, tmp_path, sup)
    for actor_id in (0, 1):
        push.send_multipart(samples(actor_id, 0))
        push.send_multipart(samples(actor_id, SEQ_MAX))
    for seq in range(20):  # enough rows for min_replay_size, from an actor that behaves
        push.send_multipart(samples(2, seq))
    wait_until(lambda: learner.batches == 24, 20, "every message to be taken")
    seen = len(sup.drain())
    updates = learner.updates
    # The learner is alive, keeps training and keeps beating: its counters still encode.
    wait_until(lambda: len(beats_after(sup, seen)) >= 2, 20, "two more learner heartbeats")
    wait_until(lambda: learner.updates > updates, 20, "more updates")
    assert learner.thread.is_alive()  # type: ignore[attr-defined]
    totals = learner.receiver.seqs.totals()
    assert totals["lost_batches"] == 0, "a jump no queue can lose is a restart, not 2**63 losses"
    assert totals["actor_restarts"] == 2
    counters = beats_after(sup, seen)[-1].counters
    assert counters["lost_batches"] == 0
    learner.request_stop()
    learner.thread.join(timeout=30)  # type: ignore[attr-defined]
    push.close(0)
    sup.close()


def test_ids_outside_the_run_share_one_bucket_in_the_learners_stats(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    learner, push = started_learner(ctx, tmp_path, sup)
    rng = np.random.default_rng(0)
    foreign = [int(i) for i in rng.integers(1000, 2**40, size=500)]
    for actor_id in foreign:
        push.send_multipart(samples(actor_id, 0))
    push.send_multipart(samples(0, 0))
    wait_until(lambda: learner.batches == len(foreign) + 1, 30, "every message to be taken")
    seqs = learner.receiver.seqs
    wait_until(lambda: seqs.totals()["untracked_batches"] == len(foreign), 10, "the intake's report")
    assert list(seqs.per_actor()) == [0]
    totals = seqs.totals()
    assert totals["untracked_batches"] == len(foreign) and totals["untracked_samples"] == 8 * len(foreign)
    assert learner.receiver.seqs.tracked_ids == learner.cfg.actor.num_actors + EXTRA_TRACKED_IDS
    learner.request_stop()
    learner.thread.join(timeout=30)  # type: ignore[attr-defined]
    push.close(0)
    sup.close()


def test_a_heartbeat_carries_counters_past_int64_as_saturated_and_drops_what_is_not_a_number() -> None:
    carried = carried_counters({"huge": 2**70, "tiny": -(2**70), "nan": float("nan"), "ok": 3, "f": 0.5})
    assert carried == {"huge": INT64_MAX, "tiny": -INT64_MAX - 1, "ok": 3, "f": 0.5}
    wire.dump(HeartbeatMsg("learner", 0, 1, 0.0, "running", carried, {}))  # encodes
