"""``zmqrl plot``: training and evaluation return curves from the runs' metrics.jsonl.

Reading and aggregating are plain numpy (tested on numbers); only ``draw`` needs matplotlib, the
optional ``plot`` extra, and it draws on a bare ``Figure`` (the Agg canvas), never through pyplot's
global state, so it works headless and changes nothing for the caller.

Runs whose config.yaml differ only in ``run.*`` (seed, name, directory) are one group: seeds of one
setting. A group of several runs is drawn as its mean on a common grid with a shaded min–max band;
groups are labelled by the config values that tell them apart.
"""

from __future__ import annotations

import logging
import math
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import numpy as np
import yaml

from zmqrl.metrics import METRICS_FILE, TRAIN_TAG, read_metrics

EVAL_TAG = "charts/eval_return"
# Points on the common x grid a group of runs is interpolated to.
GRID_POINTS = 200
# Training episodes averaged (trailing) into each point of the training curve, by default.
DEFAULT_SMOOTH = 20
# Config keys that differ between seeds of one setting: ignored when grouping runs.
RUN_KEYS_PREFIX = "run."
# Values that say where processes meet (transport.*, supervisor.status): launches on free ports
# (benchmarks/results.py, tests) differ there, and it changes nothing about what is learned.
ENDPOINT_SCHEMES = ("tcp://", "ipc://", "inproc://", "pgm://", "epgm://")
# Most config differences named in a group's label, and the ones named first when they differ.
LABEL_KEYS = 3
LABEL_FIRST = ("env.id", "agent.kind")
AXES = {"steps": "env steps (transitions)", "time": "seconds since launch"}
INSTALL_HINT = "zmqrl plot needs matplotlib: pip install 'zmqrl[plot]'"

log = logging.getLogger("zmqrl.plot")


class PlotError(Exception):
    """A run directory that cannot be plotted (no metrics.jsonl, no returns), said in one line."""


@dataclass
class Series:
    """One tag of one run: values against env steps and against seconds since launch."""

    steps: np.ndarray
    time: np.ndarray
    values: np.ndarray

    def x(self, axis: str) -> np.ndarray:
        return self.steps if axis == "steps" else self.time


@dataclass
class Run:
    path: Path
    config: dict[str, Any]  # config.yaml flattened to dotted keys ({} when there is none)
    train: Series | None
    eval: Series | None

    @property
    def target(self) -> float | None:
        value = self.config.get("learner.target_return")
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


@dataclass
class Group:
    runs: list[Run]
    label: str = ""

    @property
    def name(self) -> str:
        n = len(self.runs)
        return f"{self.label} ({n} runs)" if n > 1 else self.label


@dataclass
class Band:
    """A group's curve on a common grid: mean, min and max over the runs covering each point."""

    grid: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    count: np.ndarray  # runs covering each grid point


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as dotted keys: {"learner": {"lr": 1}} -> {"learner.lr": 1}."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _finite(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and math.isfinite(value)


def run_on_times(rows: list[dict[str, Any]]) -> list[float | None]:
    """Each row's seconds since launch, made to run on across resumes: the rows of one launch share
    ``wall - time`` (the moment it started, whichever process wrote them), and a resumed launch
    continues from the latest time any row of the launches before it reached. One clock for every
    tag, so a resumed run's train and eval curves stay aligned. None for a row without a time."""
    stamped: list[tuple[float, float] | None] = []  # (its launch's start, its time)
    latest: dict[float, float] = {}  # a launch's start -> the latest time of its rows
    for row in rows:
        t, wall = row.get("time"), row.get("wall")
        if not _finite(t):
            stamped.append(None)
            continue
        begun = wall - t if _finite(wall) else 0.0
        start = next((known for known in latest if abs(known - begun) < 1.0), begun)
        latest[start] = max(latest.get(start, 0.0), float(t))
        stamped.append((start, float(t)))
    offsets, total = {}, 0.0
    for start in sorted(latest):
        offsets[start] = total
        total += latest[start]
    return [None if at is None else at[1] + offsets[at[0]] for at in stamped]


def _series(rows: list[tuple[dict[str, Any], float]]) -> Series | None:
    """Finite values in file order, each at its run-on time (:func:`run_on_times`)."""
    steps: list[float] = []
    times: list[float] = []
    values: list[float] = []
    for row, t in rows:
        value, step = row.get("value"), row.get("step")
        if not (_finite(value) and _finite(step)):
            continue
        # Episodes reported together share a step: give them one time too (one report, one x).
        same_report = bool(steps) and step == steps[-1] and t - times[-1] < 1.0
        steps.append(float(step))
        times.append(times[-1] if same_report else t)
        values.append(float(value))
    if not values:
        return None
    return Series(np.asarray(steps, float), np.asarray(times, float), np.asarray(values, float))


def load_run(path: Path) -> Run:
    """A run directory's return curves (and config); PlotError when it has no metrics.jsonl."""
    metrics = path / METRICS_FILE
    if not path.is_dir():
        raise PlotError(f"{path}: no such run directory")
    if not metrics.is_file():
        raise PlotError(
            f"{path}: no {METRICS_FILE} (a run directory written by `zmqrl launch` or `zmqrl.train`; "
            "runs from before metrics.jsonl existed have TensorBoard events only)"
        )
    by_tag: dict[str, list[tuple[dict[str, Any], float]]] = {TRAIN_TAG: [], EVAL_TAG: []}
    rows = list(read_metrics(metrics))
    for row, t in zip(rows, run_on_times(rows), strict=True):
        if row["tag"] in by_tag and t is not None:
            by_tag[row["tag"]].append((row, t))
    config: dict[str, Any] = {}
    config_file = path / "config.yaml"
    if config_file.is_file():
        try:
            loaded = yaml.safe_load(config_file.read_text())
            config = flatten(loaded) if isinstance(loaded, dict) else {}
        except (OSError, yaml.YAMLError) as exc:
            log.warning("%s: unreadable (%s): plotted without its config", config_file, exc)
    return Run(path, config, _series(by_tag[TRAIN_TAG]), _series(by_tag[EVAL_TAG]))


def group_runs(runs: list[Run]) -> list[Group]:
    """Runs whose configs agree outside ``run.*`` and endpoints form one group, in the order first given; each
    group's label names (up to LABEL_KEYS of) the settings that tell the groups apart: env and agent
    first, and settings every group has before those only some do (another agent's options)."""
    groups: dict[str, Group] = {}
    # A key that some run's config lacks (written by an older version, before the setting existed)
    # cannot tell runs apart: only the keys every run records are compared.
    recorded = [set(r.config) for r in runs if r.config]
    shared = set.intersection(*recorded) if recorded else set()
    shared = {k for k in shared if not k.startswith(RUN_KEYS_PREFIX)}
    shared -= {
        k for r in runs for k, v in r.config.items() if isinstance(v, str) and v.startswith(ENDPOINT_SCHEMES)
    }
    for run in runs:
        setting = {k: v for k, v in run.config.items() if k in shared}
        key = repr(sorted(setting.items())) if run.config else f"dir:{run.path}"
        groups.setdefault(key, Group([])).runs.append(run)
    found = list(groups.values())
    configs = [g.runs[0].config for g in found]
    keys = shared
    differing = [k for k in keys if len({repr(c.get(k)) for c in configs}) > 1]
    differing.sort(key=lambda k: (k not in LABEL_FIRST, sum(c.get(k) is None for c in configs), k))
    for group, config in zip(found, configs, strict=True):
        if differing and config:
            group.label = ", ".join(f"{k}={config.get(k)}" for k in differing[:LABEL_KEYS])
        elif config.get("env.id") and config.get("agent.kind"):  # one setting: say what it is
            group.label = f"{config['env.id']}, {config['agent.kind']}"
        else:
            group.label = str(config.get("run.name") or group.runs[0].path.name)
    return found


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` points (fewer at the start, so the curve starts at once)."""
    if window <= 1 or values.size == 0:
        return values.copy()
    sums = np.cumsum(np.insert(values, 0, 0.0))
    idx = np.arange(1, values.size + 1)
    start = np.maximum(idx - window, 0)
    return (sums[idx] - sums[start]) / (idx - start)


def _dedupe(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sorted by x; of points sharing an x (episodes reported at the same env step) the last one
    given: for a trailing mean, the value once the whole report is in."""
    order = np.argsort(x, kind="stable")
    xs, ys = x[order], y[order]
    last = np.append(xs[1:] != xs[:-1], True)
    return xs[last], ys[last]


def aggregate(curves: list[tuple[np.ndarray, np.ndarray]], points: int = GRID_POINTS) -> Band:
    """Curves (x, y) on one grid spanning all of them; each curve interpolated only inside its own
    x range, so a shorter run stops counting where it ends rather than being extended flat. A single
    curve is returned at its own points."""
    clean = [_dedupe(np.asarray(x, float), np.asarray(y, float)) for x, y in curves if len(x)]
    if not clean:
        empty = np.zeros(0)
        return Band(empty, empty, empty, empty, np.zeros(0, dtype=int))
    if len(clean) == 1:  # one run: its own points, nothing to align
        x, y = clean[0]
        return Band(x, y, y.copy(), y.copy(), np.ones(x.size, dtype=int))
    lo = min(float(x[0]) for x, _ in clean)
    hi = max(float(x[-1]) for x, _ in clean)
    grid = np.linspace(lo, hi, points) if hi > lo else np.array([lo])
    stack = np.full((len(clean), grid.size), np.nan)
    for i, (x, y) in enumerate(clean):
        inside = (grid >= x[0]) & (grid <= x[-1])
        stack[i, inside] = np.interp(grid[inside], x, y)
    count = np.sum(~np.isnan(stack), axis=0)
    with warnings.catch_warnings():  # grid points no run covers are NaN on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        mean, low, high = np.nanmean(stack, 0), np.nanmin(stack, 0), np.nanmax(stack, 0)
    return Band(grid, mean, low, high, count)


def group_bands(group: Group, axis: str, smooth_window: int) -> tuple[Band, Band]:
    """(training, evaluation) bands of a group against ``axis`` ("steps" or "time")."""
    train = [(r.train.x(axis), smooth(r.train.values, smooth_window)) for r in group.runs if r.train]
    evals = [(r.eval.x(axis), r.eval.values) for r in group.runs if r.eval]
    return aggregate(train), aggregate(evals)


def require_matplotlib() -> None:
    """PlotError with the install hint when the ``plot`` extra is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise PlotError(INSTALL_HINT) from exc


def draw(
    run_dirs: list[Path],
    output: Path,
    *,
    x: str = "both",
    title: str | None = None,
    smooth_window: int = DEFAULT_SMOOTH,
) -> list[Group]:
    """Plot the runs' returns to ``output`` (format from its suffix); returns the groups drawn.

    Colour tells the groups apart, line style train (solid) from eval (dashed): one legend entry
    per group and per style, not per curve, so the legend stays short with many groups."""
    require_matplotlib()
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    runs = [load_run(p) for p in run_dirs]
    for run in runs:
        if run.train is None and run.eval is None:
            log.warning("%s: no returns reported yet: left out", run.path)
    runs = [r for r in runs if r.train is not None or r.eval is not None]
    if not runs:
        raise PlotError("no returns to plot: the runs have not finished an episode yet")
    groups = group_runs(runs)
    axes_names = ["steps", "time"] if x == "both" else [x]
    fig = Figure(figsize=(6.4 * len(axes_names), 4.8), dpi=120, layout="constrained")
    panels = fig.subplots(1, len(axes_names), squeeze=False)[0]
    colors = [f"C{i % 10}" for i in range(len(groups))]
    targets = sorted({t for r in runs if (t := r.target) is not None})
    for ax, axis in zip(panels, axes_names, strict=True):
        for group, color in zip(groups, colors, strict=True):
            train, evals = group_bands(group, axis, smooth_window)
            _plot_band(ax, train, color, "-", alpha=0.2)
            _plot_band(ax, evals, color, "--", alpha=0.1, marker="o")
        for target in targets:
            ax.axhline(target, color="0.35", linestyle=":", linewidth=1.2)
        ax.set_xlabel(AXES[axis])
        ax.set_ylabel("episode return")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.01)
    handles: list[Any] = [
        Line2D([], [], color=c, linewidth=3, label=g.name) for g, c in zip(groups, colors, strict=True)
    ]
    handles += [
        Line2D([], [], color="0.2", label=f"train (trailing mean of {smooth_window} episodes)"),
        Line2D([], [], color="0.2", linestyle="--", marker="o", markersize=3, label="eval (greedy)"),
    ]
    if any(len(g.runs) > 1 for g in groups):
        handles.append(Patch(color="0.2", alpha=0.18, label="mean over runs, shaded min–max"))
    handles += [Line2D([], [], color="0.35", linestyle=":", label=f"target {t:g}") for t in targets]
    panels[0].legend(handles=handles, loc="best", fontsize="small", framealpha=0.85)
    envs = sorted({str(r.config["env.id"]) for r in runs if "env.id" in r.config})
    fig.suptitle(title or (f"{', '.join(envs)}: episode return" if envs else "episode return"))
    output.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(output)
    return groups


def _plot_band(
    ax: Any, band: Band, color: str, style: str, *, alpha: float, marker: str | None = None
) -> None:
    if band.grid.size == 0:
        return
    ax.plot(
        band.grid,
        band.mean,
        color=color,
        linestyle=style,
        linewidth=1.8,
        marker=None if band.grid.size > 40 else marker,  # markers only where they can be told apart
        markersize=3,
    )
    if band.count.size and band.count.max() > 1:
        ax.fill_between(band.grid, band.low, band.high, color=color, alpha=alpha, linewidth=0)
