"""Where scalars go: a tiny Logger contract, a TensorBoard implementation and a null one.

Tags are namespaced as docs/metrics.md lists them: ``charts/...``, ``losses/...``, ``learner/...``,
``replay/...``, ``perf/...``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Protocol


class Logger(Protocol):
    def scalar(self, tag: str, value: float, step: int) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class NullLogger:
    """Discards everything (tests, and roles started without a run directory)."""

    def scalar(self, tag: str, value: float, step: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardLogger:
    """Writes TensorBoard event files under ``log_dir``."""

    def __init__(self, log_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter  # imported late: pulls in tensorboard

        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=5)

    def scalar(self, tag: str, value: float, step: int) -> None:
        self._writer.add_scalar(tag, value, step)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def fmt_value(value: Any, digits: int = 1) -> str:
    """A number for progress lines; "-" for values not measured yet (None or NaN)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.{digits}f}"
    return "-"
