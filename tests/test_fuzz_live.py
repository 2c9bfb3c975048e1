"""Live fuzzing: >10,000 malformed messages thrown at a running learner's sample port and at an
actor's weights subscription. Nothing crashes, nothing bad reaches replay, every drop is counted."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import msgpack
import numpy as np
import zmq

from tests.conftest import tiny_config, wait_until
from tests.test_roles import FakeLearner, FakeSupervisor, cartpole_batch, start, with_transport
from zmqrl.actor.main import Actor
from zmqrl.learner.main import Learner
from zmqrl.transport import wire
from zmqrl.transport.wire import HeartbeatMsg, SamplesMsg, StopMsg, WeightsMsg
from zmqrl.types import EpisodeStat, Weights

MALFORMED_PER_KIND = 700  # x 15 kinds = 10,500 messages
VALID_EVERY = 200  # one valid batch between this many malformed ones


def frames_of(msg: wire.Message) -> list[bytes]:
    return [bytes(f) for f in wire.dump(msg)]


def with_header(frames: list[bytes], **changes: object) -> list[bytes]:
    header = msgpack.unpackb(frames[0])
    header.update(changes)
    return [msgpack.packb(header), *frames[1:]]


def malformed_kinds(rng: np.random.Generator) -> list[Callable[[], list[bytes]]]:
    good = SamplesMsg(0, 0, 1, cartpole_batch(8), [EpisodeStat(10.0, 10)])
    g = frames_of(good)

    def batch(**cols: np.ndarray) -> list[bytes]:
        return frames_of(dataclasses.replace(good, batch=good.batch._replace(**cols)))

    def flip_header_byte() -> list[bytes]:
        header = bytearray(g[0])
        i = int(rng.integers(len(header)))
        header[i] ^= int(rng.integers(1, 256))
        candidate = [bytes(header), *g[1:]]
        try:  # a flip that happens to leave a valid message is not malformed: make it so
            wire.load(candidate)
            return [b"\xff" + bytes(header), *g[1:]]
        except wire.WireError:
            return candidate

    nan = np.full(8, np.nan, np.float32)
    return [
        lambda: [rng.bytes(int(rng.integers(0, 300)))],  # random bytes
        lambda: [rng.bytes(int(rng.integers(1, 50))) for _ in range(int(rng.integers(2, 8)))],
        lambda: g[:-1],  # a frame missing
        lambda: [*g, b"extra"],  # a frame too many
        lambda: [*g[:-1], g[-1][: int(rng.integers(0, len(g[-1])))]],  # truncated frame
        lambda: with_header(g, proto=2),  # wrong protocol version
        lambda: frames_of(StopMsg("not samples")),  # wrong kind
        lambda: frames_of(HeartbeatMsg("actor", 0, 1, 0.0, "running", {}, {})),
        lambda: batch(obs=good.batch.obs.astype(np.float64), next_obs=good.batch.next_obs.astype(np.float64)),
        lambda: batch(obs=np.zeros((8, 5), np.float32), next_obs=np.zeros((8, 5), np.float32)),
        lambda: batch(reward=nan if rng.random() < 0.5 else np.full(8, np.inf, np.float32)),
        lambda: batch(action=np.full(8, int(rng.integers(2, 1000)), np.int64)),
        lambda: batch(discount=np.full(8, 1.5, np.float32)),
        lambda: with_header(
            g,
            arrays=[
                {**a, "shape": [a["shape"][0] + 1, *a["shape"][1:]]} for a in msgpack.unpackb(g[0])["arrays"]
            ],
        ),  # lying lengths
        flip_header_byte,
    ]


def test_learner_survives_ten_thousand_malformed_messages(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    cfg = with_transport(
        tiny_config(tmp_path, learner__max_updates=10_000_000, learner__min_replay_size=100),
        **sup.endpoints(),
    )
    learner = Learner(cfg, ctx=ctx)
    thread = start(learner.run)
    assert learner.ready.wait(30)
    # The valid messages say they were acted with version 1: a stamp above the newest published
    # is refused (no actor can hold it), so send once the learner has published it.
    wait_until(lambda: learner.publisher.version >= 1, 10, "the learner's first publish")
    push = ctx.socket(zmq.PUSH)
    push.connect(learner.endpoints["samples"])

    rng = np.random.default_rng(0)
    kinds = malformed_kinds(rng)
    valid = frames_of(SamplesMsg(0, 0, 1, cartpole_batch(8), []))
    sent_bad = sent_good = 0
    started = time.monotonic()
    for i in range(MALFORMED_PER_KIND * len(kinds)):
        push.send_multipart(kinds[i % len(kinds)]())
        sent_bad += 1
        if i % VALID_EVERY == 0:
            push.send_multipart(valid)
            sent_good += 1

    wait_until(lambda: learner.receiver.bad.count + learner.batches == sent_bad + sent_good, 60, "ingest")
    elapsed = time.monotonic() - started
    assert learner.receiver.bad.count == sent_bad >= 10_000
    assert learner.batches == sent_good and learner.samples == 8 * sent_good
    stored = learner.replay.sample(4096, 0).batch
    assert np.isfinite(stored.reward).all() and np.isfinite(stored.obs).all()
    assert set(stored.action.tolist()) <= {0, 1} and (stored.discount <= 1).all()
    assert thread.is_alive() and learner.updates > 0, "training goes on through the flood"
    learner.request_stop()
    thread.join(timeout=30)
    push.close(0)
    sup.close()
    print(
        f"\n{sent_bad} malformed + {sent_good} valid messages ingested in {elapsed:.1f} s; "
        f"{learner.updates} updates meanwhile"
    )


def test_actor_survives_a_flood_of_malformed_weights(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    fake = FakeLearner(ctx)
    pull, pub = fake.pull, fake.pub
    cfg = with_transport(
        tiny_config(tmp_path, actor__weights_poll_steps=1), **fake.endpoints(), **sup.endpoints()
    )
    actor = Actor(cfg, 0, ctx=ctx)
    thread = start(actor.run)
    fake.greet_until(cfg, lambda: pull.poll(0), 30, "actor to start sending")
    reference = {k: np.zeros_like(v) for k, v in actor.agent.arrays.items()}  # type: ignore[attr-defined]
    name = next(iter(reference))
    rng = np.random.default_rng(1)
    good = frames_of(WeightsMsg(Weights(7, {k: np.full_like(v, 0.5) for k, v in reference.items()}), "dqn"))
    junk: list[Callable[[], list[bytes]]] = [
        lambda: [rng.bytes(int(rng.integers(0, 200)))],
        lambda: good[:-1],
        lambda: with_header(good, proto=9),
        lambda: frames_of(WeightsMsg(Weights(99, {name: reference[name]}), "dqn")),  # missing tensors
        lambda: frames_of(
            WeightsMsg(Weights(99, {k: np.full_like(v, np.nan) for k, v in reference.items()}), "dqn")
        ),
        lambda: frames_of(
            WeightsMsg(Weights(99, {k: np.zeros((3, 3), np.float32) for k in reference}), "dqn")
        ),
    ]
    for i in range(10_200):
        pub.send_multipart(junk[i % len(junk)]())
        if i % 100 == 0:
            fake.discard_samples()  # keep the actor's samples flowing
    wait_until(lambda: actor.weights.bad.count > 0, 10, "the actor to see junk")
    assert thread.is_alive() and actor.weights_client.version == 0, "no malformed weights were applied"

    def adopted() -> bool:
        pub.send_multipart(good)
        fake.discard_samples()
        return actor.weights_client.version == 7

    wait_until(adopted, 20, "the actor to adopt the valid weights after the flood")
    steps_before = actor.steps

    def stepping() -> bool:
        fake.discard_samples()
        return actor.steps > steps_before

    wait_until(stepping, 10, "the actor to keep stepping")
    sup.stop()
    thread.join(timeout=20)
    fake.close()
    sup.close()
    assert actor.stats["state"] == "stopped"
