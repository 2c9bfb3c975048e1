"""The learner's guards against non-finite numbers: skipped updates counted, and NaN never shipped.

The agents skip an update whose loss or gradients hold a NaN or infinity (zmqrl.agents.updates)
and say so; here the learner counts those skips, logs them (rate-limited), and gives up after
``learner.max_nonfinite_updates`` in a row: a network that produces nothing finite will not
recover, and a learner that keeps "training" on it only looks healthy. Behind that, the last
guard: weights with a non-finite value are never published nor checkpointed, whichever agent
made them (a plugin's update may not check), so the newest checkpoint on disk stays the last
finite one and a restarted learner resumes from it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

# At most one log line per this many seconds about skipped updates (each says how many since).
LOG_SECONDS = 5.0

log = logging.getLogger("zmqrl.learner")


class NonFiniteTraining(RuntimeError):
    """The learner gave up: updates stopped being finite, or weights to publish or save were not.

    A RuntimeError, so the learner process ends with exit 1 (failed: restarted from its newest
    checkpoint, which this guard kept finite) and its log and final stats say why.
    """


class NonFiniteUpdates:
    """Counts updates the agent skipped, and ends the run after ``max_in_a_row`` in a row."""

    def __init__(self, max_in_a_row: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.max_in_a_row = max_in_a_row
        self.total = 0  # skipped updates since the learner started (stats: nonfinite_updates)
        self.in_a_row = 0
        self._clock = clock
        self._last_log = -math.inf
        self._unlogged = 0

    def record(self, skipped: bool, updates: int) -> None:
        """After each update (``updates``: the learner's count); raises NonFiniteTraining once
        ``max_in_a_row`` updates in a row were skipped."""
        if not skipped:
            self.in_a_row = 0
            return
        self.total += 1
        self.in_a_row += 1
        self._unlogged += 1
        if self.in_a_row >= self.max_in_a_row:
            raise NonFiniteTraining(
                f"gave up after {self.in_a_row} updates in a row whose loss or gradients were NaN or "
                f"infinite (learner.max_nonfinite_updates {self.max_in_a_row}; {self.total} in all, at "
                f"update {updates}): the newest checkpoint holds the last finite weights"
            )
        now = self._clock()
        if now - self._last_log >= LOG_SECONDS:
            log.warning(
                "update %d skipped: its loss or gradients were NaN or infinite (%d skipped since the "
                "last report, %d in all, %d in a row); weights, optimiser and targets left as they were",
                updates,
                self._unlogged,
                self.total,
                self.in_a_row,
            )
            self._last_log = now
            self._unlogged = 0


def refuse_nonfinite_weights(arrays: Mapping[str, np.ndarray], what: str) -> None:
    """Raise NonFiniteTraining if any of the published ``arrays`` holds a NaN or infinity."""
    for name, arr in arrays.items():
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise NonFiniteTraining(f"refused to {what}: weights {name!r} hold NaN or infinity")


def refuse_nonfinite_state(state: Mapping[str, Any], what: str) -> None:
    """Raise NonFiniteTraining if any float in the (nested) agent ``state`` is not finite:
    networks, targets and optimiser moments, everything a resumed learner would load (tensors,
    numpy arrays, and the plain lists of floats a plugin may keep)."""
    for name, value in _floats(state, "agent"):
        if isinstance(value, torch.Tensor):
            finite = bool(torch.isfinite(value).all())
        elif isinstance(value, np.ndarray):
            finite = bool(np.isfinite(value).all())
        else:
            finite = math.isfinite(value)
        if not finite:
            raise NonFiniteTraining(f"refused to {what}: {name} holds NaN or infinity")


def _floats(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor | np.ndarray | float]]:
    if isinstance(value, torch.Tensor):
        if value.is_floating_point():
            yield path, value
    elif isinstance(value, np.ndarray):
        if value.dtype.kind == "f":
            yield path, value
    elif isinstance(value, float):
        yield path, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _floats(item, f"{path}.{key}")
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _floats(item, f"{path}[{i}]")
