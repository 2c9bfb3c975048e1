"""One comparison of zmqrl against its bare reference, and the table and JSON made of them.

Every benchmark here measures the same work twice in the same run, once through zmqrl's real code
and once without it, and reports the ratio: on a shared machine absolute numbers drift between
minutes, but two measurements interleaved in one run drift together. Each side keeps every repeat
so the table can show medians with their spread.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Units of the cost rows: CPU seconds (user + system, every thread of the processes named) per
# 1,000 env steps of the actors, per 1,000 updates of the learner.
CPU_PER_STEPS = "CPU-s/1k env steps"
CPU_PER_UPDATES = "CPU-s/1k updates"


@dataclass(frozen=True)
class BenchSettings:
    """How long to measure: ``quick`` is the one-minute smoke run, the default the full one.
    ``actors`` and ``device`` are for a bigger machine (``zmqrl bench --actors --device``)."""

    quick: bool = False
    repeats: int = 5  # measurements per side; the table shows their median, min and max
    seconds: float = 2.0  # length of one measurement where a benchmark measures by time
    actors: tuple[int, ...] | None = None  # actor counts of the scaling runs (None: the part's own)
    device: str | None = None  # the learner's agent.device: auto, cpu, cuda (None: each config's own)

    @classmethod
    def make(cls, quick: bool) -> BenchSettings:
        return cls(quick=True, repeats=3, seconds=1.0) if quick else cls()


@dataclass(frozen=True)
class Stat:
    """Repeated measurements of one side of a comparison."""

    values: tuple[float, ...]

    @classmethod
    def of(cls, values: Sequence[float]) -> Stat:
        if not values:
            raise ValueError("a Stat needs at least one measurement")
        return cls(tuple(float(v) for v in values))

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def min(self) -> float:
        return min(self.values)

    @property
    def max(self) -> float:
        return max(self.values)


@dataclass(frozen=True)
class Comparison:
    """zmqrl (``ours``) against the bare computation (``reference``) in one unit.

    ``ratio`` is ours/reference of the medians. ``target`` is the bound the ratio must meet:
    at least ``target`` when ``higher_is_better`` (throughputs), at most when not (latencies, costs).
    """

    group: str  # actor, learner, ingest, weights, scaling, replay, atari, ...
    name: str  # what was measured, e.g. "CartPole, 2 senders, uniform"
    unit: str  # e.g. "updates/s", "ms", "transitions/s"
    ours: Stat
    reference: Stat | None  # None: a plain measurement with nothing to compare (scaling rows)
    target: float | None = None
    higher_is_better: bool = True
    notes: str = ""
    extra: dict[str, float] = field(default_factory=dict)  # anything else worth keeping in the JSON

    @property
    def ratio(self) -> float | None:
        if self.reference is None or self.reference.median == 0:
            return None
        return self.ours.median / self.reference.median

    @property
    def passed(self) -> bool | None:
        """Whether the ratio meets its target (None when there is no target)."""
        ratio = self.ratio
        if self.target is None or ratio is None:
            return None
        return ratio >= self.target if self.higher_is_better else ratio <= self.target

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        for side in ("ours", "reference"):
            stat = getattr(self, side)
            data[side] = (
                None
                if stat is None
                else {"median": stat.median, "min": stat.min, "max": stat.max, "values": list(stat.values)}
            )
        data["ratio"] = self.ratio
        data["passed"] = self.passed
        return data


def _number(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


def _spread(stat: Stat) -> str:
    return f"{_number(stat.median)} ({_number(stat.min)}-{_number(stat.max)})"


def _ratio(c: Comparison) -> str:
    """The ratio to 2 decimals, or 3 where 2 would round a miss onto its target (0.896 is not 0.90)."""
    ratio = c.ratio
    if ratio is None:
        return ""
    rounds_onto_target = c.passed is False and round(ratio, 2) == round(c.target or 0.0, 2)
    return f"{ratio:.3f}x" if rounds_onto_target else f"{ratio:.2f}x"


def table_rows(comparisons: Sequence[Comparison]) -> list[list[str]]:
    """Rows of the printed table: group, name, ours, reference, unit, ratio, target, verdict."""
    rows = []
    for c in comparisons:
        target = "" if c.target is None else ("≥ " if c.higher_is_better else "≤ ") + f"{c.target:g}x"
        verdict = {True: "ok", False: "MISSED", None: ""}[c.passed]
        rows.append(
            [
                c.group,
                c.name,
                _spread(c.ours),
                "" if c.reference is None else _spread(c.reference),
                c.unit,
                _ratio(c),
                target,
                verdict,
            ]
        )
    return rows


HEADERS = [
    "group",
    "measured",
    "zmqrl median (min-max)",
    "reference median (min-max)",
    "unit",
    "ratio",
    "target",
    "",
]


def markdown_table(comparisons: Sequence[Comparison]) -> str:
    """The table as markdown (docs/performance.md is pasted from this)."""
    lines = ["| " + " | ".join(h or "result" for h in HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(comparisons)]
    return "\n".join(lines)


def write_json(path: Path, comparisons: Sequence[Comparison], meta: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"meta": meta, "results": [c.to_json() for c in comparisons]}
    path.write_text(json.dumps(payload, indent=2) + "\n")
