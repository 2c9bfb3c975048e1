"""The actor's adder (zmqrl/actor/adders.py): what an actor's steps become on the wire.

It holds batches while the learner has not been heard from and hands them over oldest first,
scored when handed over; it holds none for an on-policy agent; and its n-step messages are the
per-transition reference's batches, stamped and numbered as the actor sends them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tests.conftest import tiny_config
from tests.test_nstep_log import Reference, assert_same_batch, random_steps
from zmqrl.actor.adders import Adder
from zmqrl.actor.nstep_log import NStepLog
from zmqrl.actor.parts import build_acting
from zmqrl.types import EpisodeStat, TransitionBatch


class OneRowBatches:
    """A step log whose every ``add`` completes one single-row batch: row i holds reward i."""

    def __init__(self) -> None:
        self.rows: list[int] = []
        self.added = 0

    @property
    def ready(self) -> bool:
        return bool(self.rows)

    def add(self) -> None:
        self.rows.append(self.added)
        self.added += 1

    def take(self) -> tuple[TransitionBatch, int]:
        row, self.rows = self.rows[0], self.rows[1:]
        one = np.zeros((1, 2), np.float32)
        return TransitionBatch(one, np.zeros(1, np.int64), np.array([row], np.float32), one, np.ones(1)), row


def test_batches_are_held_until_the_learner_is_heard_then_handed_over_in_order_and_scored_then() -> None:
    weights = {"scale": 1.0}  # the priorities follow the weights held when a batch is handed over
    log = OneRowBatches()
    adder = Adder(3, log, hold_limit=2, priorities=lambda batch: batch.reward * weights["scale"])
    for ret in (1.0, 2.0):
        log.add()
        adder.finished.append(EpisodeStat(ret, 10))
        assert adder.hold(), "room for the warm-up share"
    log.add()
    assert not adder.hold(), "a full share: the actor must wait for the learner now"
    assert [m.seq for m in adder.held] == [0, 1] and all(m.priorities is None for m in adder.held)
    assert adder.episode_counters() == {"episodes": 2, "recent_return": 1.5}

    weights["scale"] = 10.0  # the learner's weights arrived
    sent = []
    while (msg := adder.pop()) is not None:
        sent.append(msg)
    assert [(m.actor_id, m.seq, m.weights_version) for m in sent] == [(3, 0, 0), (3, 1, 1), (3, 2, 2)]
    assert [m.priorities.tolist() for m in sent if m.priorities is not None] == [[0.0], [10.0], [20.0]]
    assert [m.episodes for m in sent] == [[EpisodeStat(1.0, 10)], [EpisodeStat(2.0, 10)], []]
    assert not adder.held and not adder.ready


def test_unusable_priorities_are_left_to_the_learner() -> None:
    log = OneRowBatches()
    adder = Adder(0, log, priorities=lambda batch: np.array([np.nan], np.float32))
    log.add()
    msg = adder.pop()
    assert msg is not None and msg.priorities is None and adder.priority_seconds > 0.0


def test_an_on_policy_actor_holds_nothing_before_the_learner_is_heard(tmp_path: Path) -> None:
    """Its rollouts must be acted with the learner's weights: the builder gives its adder no room."""
    cfg = tiny_config(tmp_path, agent__kind="appo", actor__rollout_length=4)
    parts = build_acting(cfg, 0)
    try:
        assert parts.adder.hold_limit == 0
        while not parts.adder.ready:
            parts.sampler.collect(1 << 20)
        assert not parts.adder.hold() and not parts.adder.held
        msg = parts.adder.pop()
        assert msg is not None and msg.seq == 0 and msg.priorities is None
    finally:
        parts.sampler.close()


def test_n_step_messages_are_the_reference_batches_numbered_stamped_and_scored() -> None:
    rng = np.random.default_rng(39)
    envs, n, gamma, send_batch = 4, 3, 0.9, 16
    ref = Reference(envs, n, gamma, send_batch, vector=True)
    adder = Adder(
        1,
        NStepLog(envs, n, gamma, send_batch, np.float32, np.int64),
        priorities=lambda batch: np.abs(batch.reward),
    )
    version = seq = 0
    for obs, actions, rewards, term, trunc, next_obs in random_steps(rng, envs, 400, True, 0.1):
        version += int(rng.random() < 0.05)
        ref.step(obs, actions, rewards, term, trunc, next_obs, version=version)
        adder.log.add(obs, actions, rewards, term, trunc, next_obs, version)
        adder.finished.extend(stat for _, stat in adder.log.ended)
        want = ref.take()
        assert adder.ready == (want is not None)
        if want is None:
            continue
        msg = adder.pop()
        assert msg is not None and isinstance(msg.batch, TransitionBatch)
        assert_same_batch(msg.batch, want[0])
        assert (msg.actor_id, msg.seq, msg.weights_version) == (1, seq, want[1])
        assert msg.priorities is not None
        np.testing.assert_array_equal(msg.priorities, np.abs(want[0].reward))
        seq += 1
    assert seq > 5 and adder.episode_counters()["episodes"] > 0
