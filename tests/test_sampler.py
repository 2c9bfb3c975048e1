"""The Sampler returns what happened and its role decides: weights due, a batch ready, the budget
spent; one acting loop for one env and for a vector of them."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.conftest import tiny_config
from zmqrl.actor.sampler import Collected
from zmqrl.serial import SerialActor

POLL = 10  # actor.weights_poll_steps in these tests


@pytest.mark.parametrize("envs", [1, 3])
def test_weights_are_due_before_the_first_step_and_every_poll_interval(tmp_path: Path, envs: int) -> None:
    cfg = tiny_config(
        tmp_path, actor__weights_poll_steps=POLL, actor__send_batch=100_000, actor__envs_per_actor=envs
    )
    actor = SerialActor(cfg, 0)
    sampler = actor.sampler
    try:
        assert sampler.collect(1_000) is Collected.WEIGHTS_DUE and sampler.steps == 0
        due_at: list[int] = []
        while (got := sampler.collect(95 - sampler.steps)) is not Collected.BUDGET_SPENT:
            assert got is Collected.WEIGHTS_DUE, "no batch is ready below send_batch"
            due_at.append(sampler.steps)
        # Due again weights_poll_steps after the last time; a vector step takes up to `envs` real
        # steps at once, so at the first count at or past that point.
        assert due_at and POLL <= due_at[0] < POLL + envs
        for before, steps in itertools.pairwise(due_at):
            assert POLL <= steps - before < POLL + envs
        assert 95 - due_at[-1] < POLL
        assert 95 <= sampler.steps < 95 + envs
        assert sampler.collect(0) is Collected.BUDGET_SPENT
    finally:
        sampler.close()


@pytest.mark.parametrize("envs", [1, 3])
def test_a_ready_batch_is_said_before_any_further_step(tmp_path: Path, envs: int) -> None:
    cfg = tiny_config(tmp_path, actor__weights_poll_steps=1_000_000, actor__envs_per_actor=envs)
    actor = SerialActor(cfg, 0)
    sampler = actor.sampler
    try:
        assert sampler.collect(10_000) is Collected.WEIGHTS_DUE
        assert sampler.collect(10_000) is Collected.BATCH_READY
        steps = sampler.steps
        assert sampler.collect(10_000) is Collected.BATCH_READY and sampler.steps == steps
        msg = actor.adder.pop()
        assert msg is not None and msg.batch.size >= cfg.actor.send_batch and msg.seq == 0
        assert not actor.adder.ready
    finally:
        sampler.close()
