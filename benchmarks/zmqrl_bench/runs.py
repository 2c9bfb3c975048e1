"""A finished (or killed) zmqrl run read back, and a run made as a process group: what
``zmqrl bench solve`` and benchmarks/results.py share. The first evaluation at a target comes from
stats.json (the evaluator's history when it ran, else the learner's), or, for a run killed before
writing it, from metrics.jsonl."""

from __future__ import annotations

import contextlib
import itertools
import json
import math
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zmqrl.metrics import TRAIN_TAG, read_metrics

# Seconds a timed-out run gets to stop on SIGTERM (zmqrl's supervisor stops its children and
# writes stats.json) before its whole process group is killed.
STOP_GRACE_S = 30.0


@dataclass(frozen=True)
class Reached:
    """What a run's records say about the target: the first evaluation at or above it (absolute
    Unix time and env steps; None when never), how many evaluations, the best, the cadence."""

    time: float | None
    steps: int | None
    evaluations: int
    best: float | None
    every: float | None
    # The record of that first evaluation, whole (what else a side keeps in it); not compared.
    record: dict[str, Any] | None = field(default=None, compare=False, repr=False)


def _cadence(steps: Sequence[float]) -> float | None:
    gaps = [b - a for a, b in itertools.pairwise(steps)]
    return statistics.median(gaps) if gaps else None


def reached_in_history(history: Sequence[dict[str, Any]], target: float, steps_key: str) -> Reached:
    """From an evaluation history (zmqrl's ``eval_history`` records, with ``time``, ``mean`` and
    ``samples``; SB3's, with ``steps``)."""
    means = [float(r["mean"]) for r in history if isinstance(r.get("mean"), (int, float))]
    hit = next((r for r in history if isinstance(r.get("mean"), (int, float)) and r["mean"] >= target), None)
    steps = hit.get(steps_key) if hit else None
    return Reached(
        time=float(hit["time"]) if hit and isinstance(hit.get("time"), (int, float)) else None,
        steps=int(steps) if isinstance(steps, (int, float)) else None,
        evaluations=len(history),
        best=max(means) if means else None,
        every=_cadence([float(r[steps_key]) for r in history if isinstance(r.get(steps_key), (int, float))]),
        record=hit,
    )


def training_returns(metrics: Path, marks: Sequence[int], window: int = 100) -> dict[str, float | None]:
    """The MinAtar paper's measure at each mark of env steps: the mean of the last ``window``
    training episodes (the actors' exploring ones, ``charts/episodic_return``) reported at or
    before it. None for a mark the run never passed (no episode reported at or beyond it), so a
    short run never reads as a figure it did not reach. Keys are the marks as strings (JSON)."""
    steps: list[float] = []
    values: list[float] = []
    with contextlib.suppress(OSError):
        for row in read_metrics(metrics):  # skips (and counts) lines a crash cut short
            step, value = row.get("step"), row.get("value")
            if row["tag"] != TRAIN_TAG or not (
                isinstance(step, (int, float)) and isinstance(value, (int, float))
            ):
                continue
            if math.isfinite(step) and math.isfinite(value):
                steps.append(float(step))
                values.append(float(value))
    out: dict[str, float | None] = {}
    for mark in marks:
        if not steps or max(steps) < mark:
            out[str(mark)] = None
            continue
        before = [v for s, v in zip(steps, values, strict=True) if s <= mark][-window:]
        out[str(mark)] = statistics.fmean(before) if before else None
    return out


def reached_in_run_dir(run_dir: Path, target: float) -> Reached:
    """A zmqrl run's first evaluation at ``target``: from stats.json as benchmarks/results.py reads
    it (the evaluator's history when it ran, else the learner's), else, for a run killed before
    writing it, from the ``charts/eval_return`` rows of metrics.jsonl (step = env steps)."""
    try:
        stats = json.loads((run_dir / "stats.json").read_text())
    except (OSError, ValueError):
        stats = None
    if isinstance(stats, dict):
        evaluator = stats.get("evaluator")  # its records count env steps; the learner's, samples
        source = evaluator or stats.get("learner") or {}
        return reached_in_history(
            source.get("eval_history") or [], target, "env_steps" if evaluator else "samples"
        )
    from zmqrl.metrics import METRICS_FILE, read_metrics

    path = run_dir / METRICS_FILE
    rows = [r for r in read_metrics(path) if r["tag"] == "charts/eval_return"] if path.exists() else []
    evaluator = [r for r in rows if r.get("source") == "evaluator"]
    history = [
        {"time": r.get("wall"), "mean": r.get("value"), "samples": r.get("step")} for r in evaluator or rows
    ]
    return reached_in_history(history, target, "samples")


def run_process(
    cmd: list[str], log: Path, timeout: float, cwd: Path | None = None
) -> tuple[float, int | None]:
    """Runs ``cmd`` in a session of its own, output to ``log``; returns (start time, exit code or
    None on timeout). A run past ``timeout`` gets SIGTERM, then its group SIGKILL; every process
    of the group is gone when this returns."""
    with log.open("wb") as out:
        started = time.time()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            code: int | None = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=STOP_GRACE_S)
        with contextlib.suppress(ProcessLookupError):  # stragglers (children) as well as the leader
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return started, code
