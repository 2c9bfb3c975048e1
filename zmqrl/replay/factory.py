"""``make_replay``: the configured replay buffer (uniform / prioritized, dense / shared frames),
each kind a class implementing ``zmqrl.core.Replay``, built after checking that it fits in memory.

Why a builder rather than the caller choosing a class: the learner (and serial mode, and tests)
then hold one interface and never branch on the kind, and the checks that belong to sizing a
buffer (the footprint, the log line people read to see the cost, the refusal when it cannot fit)
happen in one place, before anything is allocated. Replay arrays are allocated lazily by the OS,
so without the up-front check a too-large capacity would fail hours later, when the buffer fills
and the OOM killer picks the learner (see zmqrl/replay/memory.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from zmqrl.core import Replay
from zmqrl.errors import EnvError
from zmqrl.replay.frame_pool import DIGEST_BYTES, slots_for
from zmqrl.replay.frames import SharedFramesPrioritizedReplay, SharedFramesReplay, frame_layout
from zmqrl.replay.memory import ReplayMemoryError, available_memory, format_bytes
from zmqrl.replay.priorities import BetaSchedule, PriorityBounds
from zmqrl.replay.prioritized import PrioritizedReplay
from zmqrl.replay.sequences import SequenceReplay, sequence_row_bytes
from zmqrl.replay.storage import UniformReplay
from zmqrl.spec import SampleSpec

if TYPE_CHECKING:  # only the annotation: importing zmqrl.config would pull in the agents' configs
    from zmqrl.config import ReplayConfig

# Bytes per slot of prioritized replay's bookkeeping (sum tree leaves and parents, insertion ids).
PRIORITY_BYTES_PER_ROW = 8 + 16 + 8
# Distinct image planes a row adds with replay.share_frames, typically: about one (the newest
# frame) plus the stacks at episode starts; measured on Pong: see docs/architecture.md. Only what
# the log line reports: the memory check assumes the worst case (frame_pool.py, `slots_for`), every
# plane of every row distinct (noise frames, or a peer sending them), which a run can produce.
SHARED_PLANES_PER_ROW = 1.25
# A refused capacity suggests this fraction of what would just fit (room for everything else).
SUGGESTED_CAPACITY_FRACTION = 0.8

_log = logging.getLogger("zmqrl.replay")


def replay_footprint(
    capacity: int,
    spec: SampleSpec,
    prioritized: bool,
    share_frames: bool = False,
    *,
    max_add_rows: int | None = None,
    typical: bool = False,
) -> int:
    """Bytes the replay buffer can occupy once full: obs and next_obs, action, reward, discount
    (and the priority bookkeeping). Computed before allocating, so it can be refused up front.

    With shared frames, the worst case a run can produce: every plane of every row distinct,
    plus, during an add of ``max_add_rows`` rows (default: ``capacity``, the most one add keeps),
    the new rows' planes while the rows they overwrite still hold theirs (``FramePool.replace``).
    ``typical``: the estimate for the log line instead (SHARED_PLANES_PER_ROW planes a row)."""
    if spec.sequence_length is not None:  # R2D2's windows: capacity counts windows
        return capacity * sequence_row_bytes(spec, prioritized)
    obs = spec.obs_bytes
    action = int(np.prod(spec.action_shape, dtype=np.int64)) * np.dtype(spec.action_dtype).itemsize
    row = action + 4 + 4 + (PRIORITY_BYTES_PER_ROW if prioritized else 0)
    if not share_frames:
        return capacity * (row + 2 * obs)
    layout = frame_layout(spec.obs_shape, spec.obs_np_dtype)  # a Dict observation: per image key
    stored = 2 * layout.row_bytes  # obs and next_obs as a row keeps them: plane ids, other keys as they are
    if typical:
        planes = SHARED_PLANES_PER_ROW * sum(s.plane_bytes for s in layout.stacks)
        return int(capacity * (row + stored + planes))
    adding = capacity if max_add_rows is None else min(max_add_rows, capacity)
    # Each stack's pool: its worst case of live planes, each with a reference count and a digest.
    pooled = sum(
        slots_for(capacity, s.planes, adding) * (s.plane_bytes + 8 + DIGEST_BYTES) for s in layout.stacks
    )
    return int(capacity * (row + stored) + pooled)


def make_replay(
    cfg: ReplayConfig,
    spec: SampleSpec,
    *,
    seed: int,
    log: logging.Logger | None = None,
    max_add_rows: int | None = None,
) -> Replay:
    """The buffer ``cfg`` describes, with columns for ``spec``'s samples and its RNG seeded by ``seed``.

    Logs its kind and full-size footprint on ``log`` (default ``zmqrl.replay``) first. Raises
    EnvError when ``replay.share_frames`` is asked for observations with no stack of image planes
    (a Dict observation may have several, one per image key, its other keys stored densely), and
    ReplayMemoryError (naming ``replay.capacity`` and a capacity that would fit) when the
    footprint exceeds the memory available, both before anything is allocated. ``max_add_rows``:
    the most rows the caller adds at once (the worst case of shared frames depends on it).
    """
    log = log or _log
    if spec.sequence_length is not None:  # recurrent replay (R2D2): windows, not transitions
        return _sequence_replay(cfg, spec, seed, log)
    sharing = _sharing(spec) if cfg.share_frames else ""  # first: it refuses what cannot be shared
    need = replay_footprint(cfg.capacity, spec, cfg.prioritized, cfg.share_frames, max_add_rows=max_add_rows)
    budget = available_memory()
    typical = replay_footprint(cfg.capacity, spec, cfg.prioritized, cfg.share_frames, typical=True)
    log.info(
        "replay: %s%s, %d transitions of obs %s %s: %s when full (%s)",
        "prioritized" if cfg.prioritized else "uniform",
        sharing,
        cfg.capacity,
        spec.obs_dtype,
        [f"{e.key}: {e.dtype} {list(e.shape)}" for e in spec.obs_entries] or list(spec.obs_shape),
        f"about {format_bytes(typical)}, at most {format_bytes(need)} if frames never repeat"
        if cfg.share_frames
        else format_bytes(need),
        f"{format_bytes(budget.available)} available: {budget.source}" if budget else "memory unknown",
    )
    if budget is not None and need > budget.available:
        fits = max(1, int(cfg.capacity * budget.available / need * SUGGESTED_CAPACITY_FRACTION))
        worst = " if no frame repeats (noise frames, or a peer sending them)" if cfg.share_frames else ""
        raise ReplayMemoryError(
            f"replay.capacity {cfg.capacity} needs {format_bytes(need)}{worst} but only "
            f"{format_bytes(budget.available)} is available ({budget.source}); lower replay.capacity "
            f"(e.g. --set replay.capacity={fits})"
        )
    args = (cfg.capacity, spec.obs_shape, spec.obs_np_dtype, spec.action_shape, spec.action_dtype)
    if cfg.prioritized:
        per = SharedFramesPrioritizedReplay if cfg.share_frames else PrioritizedReplay
        return per(
            *args,
            seed=seed,
            alpha=cfg.alpha,
            priority_eps=cfg.priority_eps,
            max_initial_priority_ratio=cfg.max_initial_priority_ratio,
            max_priority=cfg.max_priority,
            max_draw_ratio=cfg.max_draw_ratio,
            beta=BetaSchedule(cfg.beta, cfg.beta_updates),
        )
    return (SharedFramesReplay if cfg.share_frames else UniformReplay)(*args, seed=seed)


def _sharing(spec: SampleSpec) -> str:
    """What the log line says ``replay.share_frames`` shares: every plane, or those of a Dict
    observation's image keys; EnvError saying what to do when the observations have no image."""
    try:
        layout = frame_layout(spec.obs_shape, spec.obs_np_dtype)
    except ValueError as exc:
        raise EnvError(f"{exc}: set replay.share_frames: false") from None
    keys = [s.key for s in layout.stacks if s.key is not None]
    return f", each image plane of {keys} stored once" if keys else ", each image plane stored once"


def _sequence_replay(cfg: ReplayConfig, spec: SampleSpec, seed: int, log: logging.Logger) -> Replay:
    """A ``SequenceReplay`` of ``replay.capacity`` windows, its footprint checked as above."""
    if cfg.share_frames:
        raise EnvError("replay.share_frames stores transitions' image planes; R2D2's windows: set it false")
    need = replay_footprint(cfg.capacity, spec, cfg.prioritized)
    budget = available_memory()
    log.info(
        "replay: %s, %d windows of %d steps with their core state: %s when full",
        "prioritized" if cfg.prioritized else "uniform",
        cfg.capacity,
        spec.sequence_length,
        format_bytes(need),
    )
    if budget is not None and need > budget.available:
        raise ReplayMemoryError(
            f"replay.capacity {cfg.capacity} windows need {format_bytes(need)} but only "
            f"{format_bytes(budget.available)} is available ({budget.source}); lower replay.capacity"
        )
    bounds = PriorityBounds(
        cfg.alpha, cfg.priority_eps, cfg.max_initial_priority_ratio, cfg.max_priority, cfg.max_draw_ratio
    )
    beta = BetaSchedule(cfg.beta, cfg.beta_updates)
    return SequenceReplay(cfg.capacity, spec, seed, prioritized=cfg.prioritized, bounds=bounds, beta=beta)
