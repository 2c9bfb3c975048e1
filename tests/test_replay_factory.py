"""``make_replay``: the configuration builds every kind of buffer behind ``zmqrl.core.Replay``.

What the learner relies on without asking which kind it holds: the right storage for each config,
``Sampled`` draws (importance weights and ids only from prioritized buffers, annealed by the
update count), priorities handed back (or ignored), the refusals before anything is allocated,
and adds that stay all-or-nothing through the wrapper.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

from tests.test_replay_transactions import (
    CAP,
    FAULTS,
    OBS_SHAPE,
    InjectedFault,
    assert_same,
    fault,
    noise,
    observe,
)
from zmqrl.config import ReplayConfig
from zmqrl.core import Replay, Sampled
from zmqrl.envs.factory import EnvError
from zmqrl.replay import (
    PrioritizedReplay,
    SharedFramesPrioritizedReplay,
    SharedFramesReplay,
    UniformReplay,
    factory,
    make_replay,
    replay_footprint,
)
from zmqrl.replay.memory import MemoryBudget, ReplayMemoryError
from zmqrl.spec import SampleSpec

IMAGES = SampleSpec(OBS_SHAPE, "uint8", (), "int64", num_actions=6)
VECTORS = SampleSpec((3,), "float32", (), "int64", num_actions=2)
# (prioritized, share_frames) -> the class the factory must pick.
KINDS = {
    "uniform": (False, False, UniformReplay),
    "prioritized": (True, False, PrioritizedReplay),
    "shared": (False, True, SharedFramesReplay),
    "shared_prioritized": (True, True, SharedFramesPrioritizedReplay),
}


def build(kind: str, capacity: int = CAP, **overrides: Any) -> Replay:
    """The factory's buffer of ``kind`` for small stacked-image observations."""
    prioritized, share_frames = KINDS[kind][:2]
    cfg = ReplayConfig(capacity=capacity, prioritized=prioritized, share_frames=share_frames, **overrides)
    return make_replay(cfg, IMAGES, seed=4)


def storage_of(buf: Replay) -> UniformReplay | PrioritizedReplay:
    """The factory's buffer as the class it is (no wrapper: each kind implements Replay)."""
    assert isinstance(buf, UniformReplay | PrioritizedReplay)
    return buf


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_config_builds_its_kind_and_it_satisfies_replay(kind: str) -> None:
    buf = build(kind)
    assert isinstance(buf, Replay)
    assert type(buf) is KINDS[kind][2]
    assert buf.capacity == CAP and len(buf) == 0 and buf.total_added == 0 and buf.nbytes > 0


def test_uniform_draws_have_no_importance_ids_or_metrics() -> None:
    buf = build("uniform")
    buf.add(noise(np.random.default_rng(0), 6), priorities=np.full(6, 1e30))  # priorities ignored
    drawn = buf.sample(5, updates=123)
    assert isinstance(drawn, Sampled) and drawn.batch.size == 5
    assert drawn.importance is None and drawn.ids is None and drawn.metrics == {}
    assert buf.stats() == {}


def test_prioritized_draws_carry_importance_ids_and_metrics() -> None:
    buf = build("prioritized", beta=0.5)
    buf.add(noise(np.random.default_rng(0), 6), priorities=np.array([0.1, 0.1, 0.1, 0.1, 0.1, 5.0]))
    drawn = buf.sample(16, updates=0)
    assert drawn.importance is not None and drawn.ids is not None
    assert drawn.importance.shape == (16,) and drawn.importance.dtype == np.float32
    assert drawn.importance.max() == 1.0 and drawn.importance.min() < 1.0
    assert drawn.ids.dtype == np.int64 and set(drawn.ids.tolist()) <= set(range(6))
    np.testing.assert_array_equal(drawn.batch.reward, storage_of(buf).snapshot().reward[drawn.ids])
    assert drawn.metrics == {"per_beta": 0.5, "per_importance_min": float(drawn.importance.min())}


def test_beta_anneals_linearly_to_one_by_the_update_count() -> None:
    buf = build("prioritized", beta=0.4, beta_updates=100)
    buf.add(noise(np.random.default_rng(0), 6), priorities=np.array([0.1, 0.1, 0.1, 0.1, 0.1, 5.0]))
    betas = [buf.sample(4, updates).metrics["per_beta"] for updates in (0, 50, 100, 10_000)]
    assert betas == pytest.approx([0.4, 0.7, 1.0, 1.0])


def test_beta_zero_weighs_every_row_equally_and_full_beta_does_not() -> None:
    buf = build("prioritized", beta=0.0, beta_updates=10)
    buf.add(noise(np.random.default_rng(0), 6), priorities=np.array([0.1, 0.1, 0.1, 0.1, 0.1, 5.0]))
    first = buf.sample(32, updates=0).importance
    assert first is not None and np.all(first == 1.0)
    last = buf.sample(32, updates=10).importance
    assert last is not None and last.min() < 1.0


def test_update_priorities_hands_td_errors_back_to_the_sampled_rows() -> None:
    buf = build("prioritized", alpha=1.0, priority_eps=0.0)
    buf.add(noise(np.random.default_rng(0), 6))
    drawn = buf.sample(4, updates=0)
    assert drawn.ids is not None
    buf.update_priorities(drawn.ids, np.full(4, 7.0, np.float32))
    storage = storage_of(buf)
    assert isinstance(storage, PrioritizedReplay)
    np.testing.assert_array_equal(storage.priorities_of(drawn.ids), np.full(4, 7.0))


@pytest.mark.parametrize("kind", list(KINDS))
def test_update_priorities_without_ids_changes_nothing(kind: str) -> None:
    buf = build(kind)
    buf.add(noise(np.random.default_rng(0), 6))
    before = observe(storage_of(buf))
    buf.update_priorities(None, np.full(4, 7.0, np.float32))
    assert_same(observe(storage_of(buf)), before)


def test_prioritized_stats_count_clipped_actor_priorities() -> None:
    buf = build("prioritized", max_initial_priority_ratio=2.0)
    buf.add(noise(np.random.default_rng(0), 4), priorities=np.array([0.5, 3e38, 1.0, 1e30]))
    stats = buf.stats()
    assert stats["clipped_priorities"] == 2 and stats["stale_priority_updates"] == 0


@pytest.mark.parametrize("kind", ["shared", "shared_prioritized"])
def test_shared_frames_stats_report_live_planes(kind: str) -> None:
    buf = build(kind)
    buf.add(noise(np.random.default_rng(0), 3))  # noise: every plane distinct
    assert buf.stats()["live_planes"] == 3 * 2 * OBS_SHAPE[0]


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_buffer_that_does_not_fit_is_refused_naming_replay_capacity(
    kind: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    prioritized, share_frames = KINDS[kind][:2]
    need = replay_footprint(1000, IMAGES, prioritized, share_frames)
    monkeypatch.setattr(factory, "available_memory", lambda: MemoryBudget(need - 1, "cgroup memory.max"))
    caplog.set_level(logging.INFO, logger="zmqrl.replay")
    refusal = r"replay\.capacity 1000 needs .* is available \(cgroup memory\.max\); .* replay\.capacity=\d+"
    with pytest.raises(ReplayMemoryError, match=refusal):  # names the limit that bound it
        build(kind, capacity=1000)
    assert "replay: " in caplog.text  # the cost was printed before the refusal
    monkeypatch.setattr(factory, "available_memory", lambda: MemoryBudget(need, "cgroup memory.max"))
    assert build(kind, capacity=1000).capacity == 1000


def test_unknown_available_memory_does_not_refuse(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(factory, "available_memory", lambda: None)
    assert len(build("uniform")) == 0


def test_the_log_line_goes_to_the_callers_logger(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="zmqrl.learner")
    make_replay(
        ReplayConfig(capacity=8, prioritized=True), VECTORS, seed=0, log=logging.getLogger("zmqrl.learner")
    )
    assert [r.name for r in caplog.records if r.message.startswith("replay: prioritized")] == [
        "zmqrl.learner"
    ]


@pytest.mark.parametrize("prioritized", [False, True])
def test_share_frames_on_flat_observations_is_an_env_error(prioritized: bool) -> None:
    cfg = ReplayConfig(capacity=8, prioritized=prioritized, share_frames=True)
    with pytest.raises(EnvError, match=r"replay\.share_frames needs image observations.*\[3\]"):
        make_replay(cfg, VECTORS, seed=0)


def test_footprint_counts_both_observations_and_priorities() -> None:
    row = 2 * 4 * 5 * 5 + 8 + 4 + 4
    assert replay_footprint(10, IMAGES, prioritized=False) == 10 * row
    assert replay_footprint(10, IMAGES, prioritized=True) == 10 * (row + factory.PRIORITY_BYTES_PER_ROW)
    assert replay_footprint(10, IMAGES, prioritized=False, share_frames=True, typical=True) < 10 * row


@pytest.mark.parametrize("kind", ["shared", "shared_prioritized"])
def test_the_memory_check_of_shared_frames_holds_for_noise_frames(kind: str) -> None:
    """Issue 23 item 11: the check assumed 1.25 distinct planes per row, and noise frames (or a
    peer sending them) need every plane of both observations, 8 here. Filled with noise in adds of
    up to ``max_add_rows`` rows, wrapping several times, the planes the pool ever held at once
    (their pages stay resident) fit the footprint the check allowed; the old estimate did not."""
    prioritized = KINDS[kind][0]
    capacity, max_add = 40, 16
    need = replay_footprint(capacity, IMAGES, prioritized, True, max_add_rows=max_add)
    buf = make_replay(
        ReplayConfig(capacity=capacity, prioritized=prioritized, share_frames=True),
        IMAGES,
        seed=0,
        max_add_rows=max_add,
    )
    rng = np.random.default_rng(2)
    for rows in [16, 16, 16, 9, 16, 16, 1, 16, 16, 16]:
        buf.add(noise(rng, rows))
    assert isinstance(buf, SharedFramesReplay | SharedFramesPrioritizedReplay)
    pool = buf.pool
    plane_bytes = pool.planes[0].nbytes
    assert pool.high_water == 2 * OBS_SHAPE[0] * (capacity + max_add)  # the transaction's peak
    held = pool.high_water * (plane_bytes + 8 + 16) + capacity * (8 + 4 + 4 + 2 * OBS_SHAPE[0] * 8)
    assert held <= need
    typical = replay_footprint(capacity, IMAGES, prioritized, True, typical=True)
    assert held > 2 * typical  # what the first release checked against


def fill(buf: Replay) -> None:
    """Fill, wrap and re-prioritise through the interface, the same way every time."""
    rng = np.random.default_rng(11)
    for updates, rows in enumerate((5, 6, 7)):
        buf.add(noise(rng, rows), rng.exponential(2.0, rows))
        drawn = buf.sample(6, updates)
        buf.update_priorities(drawn.ids, rng.exponential(2.0, 6))


@pytest.mark.parametrize(("kind", "where"), [(kind, where) for kind in KINDS for where in FAULTS[kind]])
def test_a_failed_add_through_the_interface_leaves_the_buffer_as_it_was(kind: str, where: str) -> None:
    buf, twin = build(kind), build(kind)
    fill(buf)
    fill(twin)
    before = observe(storage_of(buf))
    batch, priorities = noise(np.random.default_rng(99), 5), np.array([0.5, 3e38, 2.0, 1e30, 0.0])
    with fault(storage_of(buf), where, 5), pytest.raises(InjectedFault):
        buf.add(batch, priorities)
    assert_same(observe(storage_of(buf)), before)
    assert len(buf) == len(twin) and buf.total_added == twin.total_added and buf.stats() == twin.stats()
    buf.add(batch, priorities)  # retried: exactly what the twin gets at once
    twin.add(batch, priorities)
    assert_same(observe(storage_of(buf)), observe(storage_of(twin)))


@pytest.mark.parametrize("kind", ["prioritized", "shared_prioritized"])
def test_invalid_actor_priorities_are_refused_with_nothing_changed(kind: str) -> None:
    buf = build(kind)
    fill(buf)
    before = observe(storage_of(buf))
    batch = noise(np.random.default_rng(99), 3)
    for bad in (np.array([1.0, -1.0, 1.0]), np.array([1.0, np.nan, 1.0]), np.ones(2)):
        with pytest.raises(ValueError, match="priorities"):
            buf.add(batch, bad)
        assert_same(observe(storage_of(buf)), before)
