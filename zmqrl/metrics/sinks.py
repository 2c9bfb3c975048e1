"""What every sink of the run's logger shares: the Sink contract, the tracker settings it reads
(``TrackerOptions``), and how a tracker closes without holding up the role's exit.

Apart from zmqrl.metrics.trackers so that the trackers' sinks (wandb_sink, mlflow_sink) and the
module that chooses among them import it one way.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Sequence
from typing import Protocol

# Seconds a tracker may take to finish its run at close before the role exits without it
# (an unreachable server must not keep a finished role alive).
CLOSE_SECONDS = 30.0

log = logging.getLogger("zmqrl.metrics")


class Sink(Protocol):
    """One place scalars go besides metrics.jsonl; failures raise and the run logger reports them."""

    name: str

    def scalar(self, tag: str, value: float, step: int, wall: float) -> None: ...

    def flush(self) -> None: ...

    def close(self) -> None: ...


class TrackerOptions(Protocol):
    """What the trackers read of the ``logging`` section (zmqrl.config.LoggingConfig fits)."""

    @property
    def backends(self) -> Sequence[str]: ...

    @property
    def project(self) -> str: ...

    @property
    def wandb_mode(self) -> str: ...

    @property
    def wandb_entity(self) -> str | None: ...

    @property
    def mlflow_tracking_uri(self) -> str | None: ...


def finite(value: float) -> bool:
    """Trackers get measured values only (metrics.jsonl keeps the row, as null)."""
    return math.isfinite(float(value))


def bounded(action: Callable[[], None], what: str, seconds: float = CLOSE_SECONDS) -> None:
    """Run ``action`` on a daemon thread and wait at most ``seconds``: a tracker finishing its
    run (an upload to a server that does not answer) must never keep a role from exiting. An
    error is logged, not raised: closing is the end of a run that has already done its work."""
    failed: list[BaseException] = []

    def attempt() -> None:
        try:
            action()
        except Exception as exc:  # the tracker's own trouble; the run's results are elsewhere
            failed.append(exc)

    worker = threading.Thread(target=attempt, name=f"close {what}", daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        log.warning("%s did not finish within %.0f s; the role exits without waiting for it", what, seconds)
    elif failed:
        log.warning("%s failed to finish (%s)", what, failed[0])
