"""``make_replay``: the configured replay buffer (uniform / prioritized, dense / shared frames),
built behind ``zmqrl.core.Replay`` after checking that it fits in memory.

Why a builder rather than the caller choosing a class: the learner (and serial mode, and tests)
then hold one interface and never branch on the kind, and the checks that belong to sizing a
buffer (the footprint, the log line people read to see the cost, the refusal when it cannot fit)
happen in one place, before anything is allocated. Replay arrays are allocated lazily by the OS,
so without the up-front check a too-large capacity would fail hours later, when the buffer fills
and the OOM killer picks the learner (see zmqrl/memory.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np

from zmqrl.core import Replay
from zmqrl.env_ids import EnvError
from zmqrl.memory import ReplayMemoryError, available_memory_bytes, format_bytes
from zmqrl.replay.buffers import BetaSchedule, PrioritizedBuffer, UniformBuffer
from zmqrl.replay.frames import SharedFramesPrioritizedReplay, SharedFramesReplay
from zmqrl.replay.prioritized import PrioritizedReplay
from zmqrl.replay.storage import UniformReplay
from zmqrl.spec import SampleSpec

if TYPE_CHECKING:  # only the annotation: importing zmqrl.config would pull in the agents' configs
    from zmqrl.config import ReplayConfig

# Bytes per slot of prioritized replay's bookkeeping (sum tree leaves and parents, insertion ids).
PRIORITY_BYTES_PER_ROW = 8 + 16 + 8
# Distinct image planes a row adds with replay.share_frames, for the memory estimate: about one
# (the newest frame) plus the stacks at episode starts; measured on Pong: see docs/architecture.md.
SHARED_PLANES_PER_ROW = 1.25
# A refused capacity suggests this fraction of what would just fit (room for everything else).
SUGGESTED_CAPACITY_FRACTION = 0.8

_log = logging.getLogger("zmqrl.replay")


def replay_footprint(capacity: int, spec: SampleSpec, prioritized: bool, share_frames: bool = False) -> int:
    """Bytes the replay buffer will occupy once full: obs and next_obs, action, reward, discount
    (and the priority bookkeeping). Computed before allocating, so it can be refused up front.
    With shared frames, the planes are an estimate (SHARED_PLANES_PER_ROW distinct planes a row)."""
    obs = int(np.prod(spec.obs_shape, dtype=np.int64)) * np.dtype(spec.obs_dtype).itemsize
    action = int(np.prod(spec.action_shape, dtype=np.int64)) * np.dtype(spec.action_dtype).itemsize
    row = action + 4 + 4 + (PRIORITY_BYTES_PER_ROW if prioritized else 0)
    if not share_frames:
        return capacity * (row + 2 * obs)
    planes = spec.obs_shape[0]
    ids = 2 * planes * 8
    return int(capacity * (row + ids + SHARED_PLANES_PER_ROW * obs / planes))


def make_replay(
    cfg: ReplayConfig, spec: SampleSpec, *, seed: int, log: logging.Logger | None = None
) -> Replay:
    """The buffer ``cfg`` describes, with columns for ``spec``'s samples and its RNG seeded by ``seed``.

    Logs its kind and full-size footprint on ``log`` (default ``zmqrl.replay``) first. Raises
    EnvError when ``replay.share_frames`` is asked for observations that are not image stacks, and
    ReplayMemoryError (naming ``replay.capacity`` and a capacity that would fit) when the
    footprint exceeds the memory available, both before anything is allocated.
    """
    log = log or _log
    if cfg.share_frames and len(spec.obs_shape) < 2:
        raise EnvError(
            f"replay.share_frames needs image observations (planes, height, width); the env's are "
            f"{list(spec.obs_shape)}: set replay.share_frames: false"
        )
    need = replay_footprint(cfg.capacity, spec, cfg.prioritized, cfg.share_frames)
    available = available_memory_bytes()
    log.info(
        "replay: %s%s, %d transitions of obs %s %s: %s%s when full (%s available)",
        "prioritized" if cfg.prioritized else "uniform",
        ", each image plane stored once" if cfg.share_frames else "",
        cfg.capacity,
        spec.obs_dtype,
        list(spec.obs_shape),
        "about " if cfg.share_frames else "",
        format_bytes(need),
        format_bytes(available) if available is not None else "unknown",
    )
    if available is not None and need > available:
        fits = max(1, int(cfg.capacity * available / need * SUGGESTED_CAPACITY_FRACTION))
        raise ReplayMemoryError(
            f"replay.capacity {cfg.capacity} needs {format_bytes(need)} but this machine has "
            f"{format_bytes(available)} available; lower replay.capacity (e.g. --set replay.capacity="
            f"{fits})"
        )
    args = (cfg.capacity, spec.obs_shape, spec.obs_dtype, spec.action_shape, spec.action_dtype)
    if cfg.prioritized:
        per = SharedFramesPrioritizedReplay if cfg.share_frames else PrioritizedReplay
        storage = per(
            *args,
            seed=seed,
            alpha=cfg.alpha,
            priority_eps=cfg.priority_eps,
            max_initial_priority_ratio=cfg.max_initial_priority_ratio,
        )
        return PrioritizedBuffer(storage, BetaSchedule(cfg.beta, cfg.beta_updates))
    uniform = SharedFramesReplay if cfg.share_frames else UniformReplay
    return UniformBuffer(uniform(*args, seed=seed))
