"""Where scalars go: a tiny Logger contract, the run's logger (metrics.jsonl + sinks), a null one.

Every role that reports scalars gets its logger from ``run_logger(run_dir, source, config=cfg)``;
each scalar then goes to metrics.jsonl and to the backends ``logging.backends`` names (TensorBoard
by default; Weights & Biases and MLflow through zmqrl.metrics.trackers):

- TensorBoard event files: ``run_dir/tb`` for the learner (and serial runs), ``run_dir/tb/<source>``
  for the others, so TensorBoard shows one run per role;
- ``run_dir/metrics.jsonl``: one strict-JSON row per scalar, shared by every process of the run, so
  curves can be read (``zmqrl plot``, ``jq``, pandas) without TensorBoard.

Tags are namespaced (``NAMESPACES``) and each is listed in docs/metrics.md with its meaning, unit and
x-axis; tests/test_metrics_tags.py fails when a run writes a tag the docs do not list.

No sink imports torch: the supervisor is a light process, and tensorboard's own event writer
imports in a fraction of the time torch's ``SummaryWriter`` takes. Metrics are a report, never a
reason to die: a failed write (or a tracker that cannot start its run) is logged once and training
goes on. The one exception is a setting to fix: a tracker named whose package is not installed
stops the role at its start, with one line naming the pip command.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

from zmqrl.metrics.sinks import Sink
from zmqrl.metrics.trackers import (
    TRACKER_MODULES,
    TrackedConfig,
    TrackerMissing,
    missing_tracker,
    open_tracker,
)

METRICS_FILE = "metrics.jsonl"
# The tag of each training (exploring) episode's return: what curves and the MinAtar paper's
# measure are read from.
TRAIN_TAG = "charts/episodic_return"
TB_DIR = "tb"
# The first path segment every tag must have (docs/metrics.md explains each).
NAMESPACES = ("charts", "losses", "actor", "learner", "replay", "perf", "supervisor")
# Sources whose TensorBoard events go straight under tb/ (where they always have), not tb/<source>.
_TB_ROOT_SOURCES = frozenset({"learner"})
# The sinks besides metrics.jsonl when no config chooses them.
DEFAULT_BACKENDS = ("tensorboard",)
# Seconds between TensorBoard's background flushes (a crash loses at most this much).
TB_FLUSH_SECONDS = 5.0
# Pending TensorBoard events before a write blocks on the background flush.
TB_QUEUE_SIZE = 100

log = logging.getLogger("zmqrl.metrics")


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


def namespaced(tag: str) -> bool:
    """Whether ``tag`` is ``<namespace>/<name>`` with one of ``NAMESPACES``."""
    head, sep, name = tag.partition("/")
    return bool(sep and name) and head in NAMESPACES


def tb_dir(run_dir: Path, source: str) -> Path:
    return run_dir / TB_DIR if source in _TB_ROOT_SOURCES else run_dir / TB_DIR / source


def metrics_row(source: str, tag: str, value: float, step: int, *, launched: float, wall: float) -> str:
    """One metrics.jsonl line: strict JSON, a non-finite value written as ``null`` (the row stays, so
    a reader sees the tag was reported but not measured)."""
    number = float(value)
    row = {
        "source": source,
        "tag": tag,
        "step": int(step),
        "value": number if math.isfinite(number) else None,
        "time": round(wall - launched, 3),
        "wall": round(wall, 3),
    }
    return json.dumps(row, allow_nan=False, separators=(", ", ": ")) + "\n"


class MetricsFile:
    """Appends rows to metrics.jsonl, shared by several processes at once.

    The file is opened ``O_APPEND`` and every row is one ``os.write``: the kernel then places each
    write at the end of the file as a whole, so rows from different processes never interleave
    (a buffered Python file could split a row across two flushes).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)

    def write(self, line: str) -> None:
        if self._fd is None:
            return
        data = line.encode()
        written = os.write(self._fd, data)
        if written != len(data):  # a full disk: the row is cut short; say so rather than pretend
            raise OSError(f"short write to {self.path}: {written} of {len(data)} bytes")

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class EventWriter:
    """TensorBoard scalars through tensorboard's own event writer (no torch import).

    Opening it (tensorboard's protobuf modules and the event file, a noticeable share of a
    launch) runs on a thread of its own, started here: a role's start-up (the supervisor
    starting its children, the learner its first weights) does not wait for it; the first
    scalar, flush or close does. A failure to open is raised there, as a failed write is.
    """

    name = "tensorboard"

    def __init__(self, log_dir: Path) -> None:
        self._writer: Any = None
        self._failure: Exception | None = None
        self._opening = threading.Thread(
            target=self._open, args=(log_dir,), name="tensorboard-open", daemon=True
        )
        self._opening.start()

    def _open(self, log_dir: Path) -> None:
        try:
            from tensorboard.compat.proto import event_pb2, summary_pb2  # late: only runs that log pay
            from tensorboard.summary.writer.event_file_writer import EventFileWriter

            self._event = event_pb2.Event
            self._summary = summary_pb2.Summary
            self._writer = EventFileWriter(
                str(log_dir), max_queue_size=TB_QUEUE_SIZE, flush_secs=TB_FLUSH_SECONDS
            )
        except Exception as exc:  # ImportError, OSError, protobuf trouble: raised to the caller
            self._failure = exc

    def _opened(self) -> Any:
        self._opening.join()
        if self._failure is not None:
            raise self._failure
        return self._writer

    def scalar(self, tag: str, value: float, step: int, wall: float) -> None:
        writer = self._opened()
        summary = self._summary(value=[self._summary.Value(tag=tag, simple_value=float(value))])
        writer.add_event(self._event(wall_time=wall, step=int(step), summary=summary))

    def flush(self) -> None:
        self._opened().flush()

    def close(self) -> None:
        self._opened().close()


class RunLogger:
    """A run's ``Logger``: each scalar to metrics.jsonl and to the chosen sinks (TensorBoard,
    W&B, MLflow: ``trackers.Sink``).

    Any part may be missing (tensorboard not installed, a read-only run directory, a tracker that
    could not start its run): the others go on. A part that fails is reported once, with the
    error, and tried again on the next scalar (a full disk may be cleared); a tag outside
    ``NAMESPACES`` is reported once and written anyway. Only a tracker named in the settings whose
    package is not installed stops the role at its start (``TrackerMissing``, one line).
    """

    def __init__(
        self,
        run_dir: Path,
        source: str,
        *,
        launched: float | None = None,
        config: TrackedConfig | None = None,
    ) -> None:
        self.source = source
        self.launched = time.time() if launched is None else launched
        self._seen: set[str] = set()
        self._failed: set[str] = set()
        self._jsonl: MetricsFile | None = None
        self.sinks: list[Sink] = []
        backends = list(config.logging.backends) if config is not None else list(DEFAULT_BACKENDS)
        if problem := missing_tracker(backends):
            raise TrackerMissing(problem)
        try:
            self._jsonl = MetricsFile(run_dir / METRICS_FILE)
        except OSError as exc:
            self._report("metrics.jsonl", exc)
        if "tensorboard" in backends:
            try:
                self.sinks.append(EventWriter(tb_dir(run_dir, source)))
            except Exception as exc:  # ImportError, OSError, protobuf trouble: all non-fatal
                self._report("tensorboard", exc)
        for name in dict.fromkeys(backends):  # each once, in the order named
            if name in TRACKER_MODULES and config is not None:
                try:
                    self.sinks.append(open_tracker(name, run_dir, source, config))
                except Exception as exc:  # no network, a server refusing: the run goes on without it
                    self._report(name, exc)

    def scalar(self, tag: str, value: float, step: int) -> None:
        if tag not in self._seen:
            self._seen.add(tag)
            if not namespaced(tag):
                log.warning("metric tag %r is outside the namespaces %s", tag, "/, ".join(NAMESPACES) + "/")
        wall = time.time()
        if self._jsonl is not None:
            try:
                row = metrics_row(self.source, tag, value, step, launched=self.launched, wall=wall)
                self._jsonl.write(row)
            except (OSError, TypeError, ValueError) as exc:
                self._report("metrics.jsonl", exc)
        for sink in self.sinks:
            try:
                sink.scalar(tag, value, step, wall)
            except Exception as exc:  # see __init__
                self._report(sink.name, exc)

    def flush(self) -> None:
        for sink in self.sinks:
            try:
                sink.flush()
            except Exception as exc:  # see __init__
                self._report(sink.name, exc)

    def close(self) -> None:
        """Every sink closed, each whatever the others do (a tracker finishes its run within
        ``trackers.CLOSE_SECONDS``); safe to call twice."""
        sinks, self.sinks = self.sinks, []
        for sink in sinks:
            try:
                sink.close()
            except Exception as exc:  # see __init__
                self._report(sink.name, exc)
        jsonl, self._jsonl = self._jsonl, None
        if jsonl is not None:
            jsonl.close()

    def _report(self, part: str, exc: BaseException) -> None:
        if part not in self._failed:
            self._failed.add(part)
            log.warning("%s: cannot write %s metrics (%s); the run goes on", self.source, part, exc)


def run_logger(
    run_dir: Path, source: str, *, launched: float | None = None, config: TrackedConfig | None = None
) -> Logger:
    """The logger a role reports through: ``source`` names the role ("learner", "evaluator",
    "supervisor", ...); ``launched`` (Unix seconds, default now) is what metrics.jsonl's ``time``
    counts from: pass ``zmqrl.runtime.launched.launch_time()`` so every process counts from the launch.
    ``config`` (the run's Config) chooses the sinks by its ``logging.backends`` and is logged
    with the trackers' runs; without it, TensorBoard and metrics.jsonl. Raises ``TrackerMissing``
    (a ConfigError: the CLI prints one line) when a named tracker's package is not installed."""
    return RunLogger(run_dir, source, launched=launched, config=config)


def read_metrics(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a metrics.jsonl; a line that is not a JSON object (a row cut short by a crash)
    is skipped with a warning, once per file, so one bad line does not hide a run's curves."""
    skipped = 0
    with path.open(encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except ValueError:
                row = None
            if isinstance(row, dict) and isinstance(row.get("tag"), str):
                yield row
            elif line.strip():
                skipped += 1
    if skipped:
        log.warning("%s: skipped %d malformed line(s)", path, skipped)


def fmt_value(value: Any, digits: int = 1) -> str:
    """A number for progress lines; "-" for values not measured yet (None or NaN)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.{digits}f}"
    return "-"
