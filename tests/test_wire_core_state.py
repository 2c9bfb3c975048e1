"""A recurrent run's rollouts on the wire (issue 40 item 2): the ``core_state`` array after the seven
columns round-trips, and a message with, without or with a wrongly shaped or valued state is
refused by the run whose spec says otherwise; groups, the intake's frames and the rollout queue
carry it with its rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pytest

from tests.test_wire_rollouts import (
    DISCRETE,
    columns_of,
    frames_of,
    make_rollouts,
    message,
    raw_frames,
    refused,
)
from zmqrl.learner.intake_wire import dump_group, load_group
from zmqrl.replay.rollout_queue import merge_rows, split_rows
from zmqrl.spec import DEFAULT_MAX_ABS_CORE_CELL, MAX_CORE_SIZE, SampleSpec
from zmqrl.transport.messages import SampleGroup
from zmqrl.transport.wire import KIND_ROLLOUTS, WireError, dump, load_samples
from zmqrl.types import CORE_STATE_FIELD, RolloutBatch

H = 4
RECURRENT = dataclasses.replace(DISCRETE, core_size=H, max_abs_core_cell=500.0)


def recurrent_rollouts(rows: int = 3, seed: int = 0) -> RolloutBatch:
    rng = np.random.default_rng(seed)
    state = np.stack(
        [rng.uniform(-1, 1, (rows, H)), rng.uniform(-400, 400, (rows, H))], axis=1
    ).astype(np.float32)
    cuts = ((0, 5), (rows - 1, 1))
    batch = make_rollouts(RECURRENT, rows=rows, cuts=cuts, ends=((0, 2),), seed=seed)
    return batch._replace(core_state=state)


def test_the_state_round_trips_after_the_seven_columns() -> None:
    batch = recurrent_rollouts()
    frames = frames_of(message(batch))
    names = [d["name"] for d in __import__("msgpack").unpackb(frames[0])["arrays"]]
    assert names[-1] == CORE_STATE_FIELD and len(names) == 8
    got = load_samples(frames, RECURRENT).batch
    assert isinstance(got, RolloutBatch) and got.core_state is not None
    assert got.core_state.tobytes() == batch.core_state.tobytes()  # type: ignore[union-attr]
    assert got.core_state.shape == (3, 2, H) and got.core_state.dtype == np.float32


def test_a_feed_forward_message_keeps_its_seven_frames() -> None:
    frames = frames_of(message(make_rollouts(DISCRETE)))
    assert len(frames) == 8 and load_samples(frames, DISCRETE).batch.core_state is None  # type: ignore[union-attr]


def test_the_run_refuses_a_state_it_has_none_of_and_wants_the_one_it_has() -> None:
    refused(frames_of(message(recurrent_rollouts())), DISCRETE, "no recurrent core")
    refused(frames_of(message(make_rollouts(RECURRENT))), RECURRENT, "without a core_state")
    other = dataclasses.replace(RECURRENT, core_size=H + 1)
    refused(frames_of(message(recurrent_rollouts())), other, r"core_state is float32 \(3, 2, 4\)")


def _state(edit: Callable[[np.ndarray], None]) -> list[bytes]:
    batch = recurrent_rollouts()
    state = batch.core_state.copy()  # type: ignore[union-attr]
    edit(state)
    return frames_of(message(batch._replace(core_state=state)))


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        (lambda s: s.__setitem__((0, 0, 1), 1.5), "h outside"),
        (lambda s: s.__setitem__((2, 0, 0), np.nan), "h outside"),
        (lambda s: s.__setitem__((1, 1, 3), 501.0), "c outside"),
        (lambda s: s.__setitem__((1, 1, 0), -np.inf), "c outside"),
        (lambda s: s.__setitem__((0, 1, 2), np.nan), "c outside"),
    ],
    ids=["h>1", "h-nan", "c-beyond-limit", "c-inf", "c-nan"],
)
def test_a_state_the_run_cannot_mean_is_refused(edit: Callable[[np.ndarray], None], match: str) -> None:
    refused(_state(edit), RECURRENT, match)


@pytest.mark.parametrize(
    ("state", "match"),
    [
        (np.zeros((3, 2, H), np.float64), "float32"),
        (np.zeros((2, 2, H), np.float32), "R the rows"),
        (np.zeros((3, 3, H), np.float32), r"\[R, 2, H\]"),
        (np.zeros((3, 2, 0), np.float32), "H >= 1"),
        (np.zeros((3, 2 * H), np.float32), r"\[R, 2, H\]"),
    ],
    ids=["float64", "rows", "three-parts", "no-units", "flat"],
)
def test_a_malformed_state_layout_is_refused(state: np.ndarray, match: str) -> None:
    columns = [*columns_of(make_rollouts(RECURRENT)), (CORE_STATE_FIELD, state)]
    assert len(columns) == 8
    with pytest.raises(WireError, match=match):
        load_samples(raw_frames(KIND_ROLLOUTS, columns), RECURRENT)


def test_a_state_in_the_wrong_place_or_twice_is_refused() -> None:
    batch = recurrent_rollouts()
    columns = columns_of(make_rollouts(RECURRENT))
    state = (CORE_STATE_FIELD, batch.core_state)
    for layout in ([state, *columns], [*columns, state, state], [*columns[:6], state, columns[6]]):
        with pytest.raises(WireError, match="rollouts arrays must be"):
            load_samples(raw_frames(KIND_ROLLOUTS, layout), RECURRENT)  # type: ignore[arg-type]


def test_the_default_cell_bound_is_finite_and_the_spec_checks_its_state_size() -> None:
    bound = DEFAULT_MAX_ABS_CORE_CELL
    assert np.isfinite(bound) and np.float32(bound) == bound
    with pytest.raises(ValueError, match="core_size"):
        SampleSpec((2,), "float32", (), "int64", num_actions=2, core_size=4)  # no rollouts
    with pytest.raises(ValueError, match="core_size must be 0 to 8192"):
        dataclasses.replace(RECURRENT, core_size=MAX_CORE_SIZE + 1)


def test_groups_the_intake_and_the_queue_carry_each_rows_state() -> None:
    a, b = recurrent_rollouts(2, seed=1), recurrent_rollouts(3, seed=2)
    group = SampleGroup.of([load_samples(frames_of(message(x)), RECURRENT) for x in (a, b)])
    merged = group.batch
    assert isinstance(merged, RolloutBatch) and merged.core_state is not None
    both = [a.core_state, b.core_state]
    np.testing.assert_array_equal(merged.core_state, np.concatenate(both))  # type: ignore[arg-type]
    again = load_group([bytes(f) for f in dump_group(group)]).batch
    assert isinstance(again, RolloutBatch) and again.core_state is not None
    np.testing.assert_array_equal(again.core_state, merged.core_state)
    rows = split_rows(again)
    assert [r.core_state.shape for r in rows] == [(1, 2, H)] * 5  # type: ignore[union-attr]
    np.testing.assert_array_equal(merge_rows(rows[1:4]).core_state, merged.core_state[1:4])
    with pytest.raises(ValueError, match="core state"):
        SampleGroup.of([message(a), message(make_rollouts(DISCRETE, rows=2, cuts=()))])


def test_dump_writes_the_state_only_when_the_batch_has_one() -> None:
    assert len(dump(message(recurrent_rollouts()))) == 9
    assert len(dump(message(make_rollouts(DISCRETE)))) == 8
