"""Whether a run is still getting better: the rule behind the "no progress" warning of the
dashboard, the progress lines, ``zmqrl status`` and the final summary.

A config copied to another task with only ``env.id`` changed often trains at full speed while
learning nothing (SAC on a sparse-reward task whose entropy weight collapses before the goal is
ever found): every rate looks healthy, only the evaluations stay flat. :class:`ProgressWatch` is
fed what the supervisor already hears (its clock, the best evaluation return, the count of
evaluations) and answers whether the run is stalled, since when and on how many evaluations; it
holds no I/O, so its tests drive it with a made-up clock. The rest of the module words the
warning: which tuned config in ``configs/zoo/`` to try (:func:`zoo_pointer`) and, for SAC, the
entropy weight the learner last logged (:func:`latest_logged`).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import yaml

from zmqrl.config import Config

# A new best counts as progress only when it beats the previous one by this share of the return
# scale (the largest of |best|, |target|, how far the best has come since the first evaluation,
# and 1). Evaluations are noisy: the best of many draws of a flat policy still creeps up by small
# amounts (the maximum of n noisy samples grows like sqrt(2 ln n) of their spread), which must not
# read as learning; 1% of the scale is well above that creep for the greedy, many-episode means
# the evaluators report, and well below what a learning run gains between two bests (CartPole:
# 4.75 of 475; Pendulum: ~2 of -200 and its first -1500s). The floor of 1 keeps returns near 0
# (a policy that stands still) from making every crumb of noise a new best.
RELATIVE_TOLERANCE = 0.01
# Evaluations needed in the flat stretch: a run that evaluates rarely is not judged on one or two.
MIN_EVALUATIONS = 3
# SAC's entropy weight below this has collapsed: the policy is near-deterministic and explores no
# more. Autotuned SAC settles well above it on the tasks it learns, and a run that learns nothing
# drives it down steadily (docs/performance.md): it says "collapsed" only past a healthy range.
ALPHA_COLLAPSED = 1e-3
# The tuned configs, one or more per task (configs/zoo/*.yaml), under the package's repo root.
ZOO_DIR = Path(__file__).resolve().parents[2] / "configs" / "zoo"
# The fallback when no zoo config names the run's env.
RESULTS_POINTER = "see docs/results.md for tuned configs"
# Bytes read from the end of metrics.jsonl for the latest logged value of a tag (every row is one
# short line: this is hundreds of log points of the learner's scalars).
TAIL_BYTES = 256 * 1024
# Seconds between two reads of the entropy weight from metrics.jsonl while a run is stalled.
ALPHA_READ_SECONDS = 30.0
# The tag the learner logs SAC's entropy weight under (docs/metrics.md).
ALPHA_TAG = "losses/alpha"

log = logging.getLogger("zmqrl.supervisor")


@dataclass(frozen=True)
class Stall:
    """A run with no new best evaluation for ``seconds`` (``evaluations`` of them meanwhile)."""

    since: float  # the watch's clock at the last new best (or the first evaluation it saw)
    seconds: float  # how long since then
    best: float  # the best evaluation return so far
    evaluations: int  # evaluations since the last new best
    target_met_first: bool  # the target was met by the very first evaluation, before any learning


class ProgressWatch:
    """The no-progress rule for one run.

    ``no_progress_seconds`` (``supervisor.no_progress_seconds``; 0 turns the watch off) is how
    long without a new best evaluation, with at least ``min_evaluations`` evaluations in that
    stretch, makes a run stalled. A run whose best reached ``target`` (``learner.target_return``)
    is never stalled again, except when the very first evaluation already met it: an untrained
    policy meeting the target says the target belongs to another task (a config copied with only
    ``env.id`` changed), not that the run learned. A new best clears the stall.

    Call :meth:`observe` whenever there is news or not (it is cheap); the counts may restart
    from zero (a restarted evaluator): only their rises are counted.
    """

    def __init__(
        self,
        no_progress_seconds: float,
        target: float | None = None,
        *,
        min_evaluations: int = MIN_EVALUATIONS,
        tolerance: float = RELATIVE_TOLERANCE,
    ) -> None:
        self.limit = no_progress_seconds
        self.target = target
        self.min_evaluations = min_evaluations
        self.tolerance = tolerance
        self._count = 0  # evaluations seen in all, across restarts of the source
        self._last_reported: float | None = None  # the source's own count at the last observe
        self._first: float | None = None  # the first best seen
        self._mark: tuple[float, float, int] | None = None  # (clock, best, count) at the latest new best
        self._target_met_first = False
        self.reached = False  # the target was reached (after the first evaluation): never stalled

    def observe(self, now: float, best: float | None, evaluations: float | None) -> Stall | None:
        """The run as of clock ``now`` given the best evaluation return so far (None or NaN:
        none yet) and the source's count of evaluations; None when not stalled."""
        self._count_evaluations(evaluations)
        if self.limit <= 0 or best is None or not math.isfinite(best):
            return None
        if self._mark is None:
            self._first = best
            self._mark = (now, best, self._count)
            # Only a watch that saw the run's first evaluation can tell it met the target unlearned.
            if self.target is not None and best >= self.target and self._count <= 1:
                self._target_met_first = True
        if self.target is not None and best >= self.target and not self._target_met_first:
            self.reached = True
        if self.reached:
            return None
        at, mark_best, mark_count = self._mark
        if best > mark_best + self.margin(mark_best):
            self._mark = (now, best, self._count)
            return None
        seconds, evaluations_since = now - at, self._count - mark_count
        if seconds < self.limit or evaluations_since < self.min_evaluations:
            return None
        return Stall(at, seconds, mark_best, evaluations_since, self._target_met_first)

    def margin(self, best: float) -> float:
        """How much a new best must beat ``best`` by to count (see RELATIVE_TOLERANCE)."""
        scale = max(abs(best), 1.0)
        if self.target is not None:
            scale = max(scale, abs(self.target))
        if self._first is not None:
            scale = max(scale, abs(best - self._first))
        return self.tolerance * scale

    def _count_evaluations(self, evaluations: float | None) -> None:
        if evaluations is None or not math.isfinite(evaluations):
            return
        last = self._last_reported
        rise = evaluations if last is None or evaluations < last else evaluations - last
        self._count += int(rise)
        self._last_reported = evaluations


@dataclass(frozen=True)
class ZooConfig:
    """A tuned config in configs/zoo/ for an env: where it is and the run name it sets."""

    path: str  # as the user types it from the repo root: "configs/zoo/<file>"
    run_name: str | None
    agent: str | None


def zoo_config(env_id: str, agent: str | None = None, zoo_dir: Path = ZOO_DIR) -> ZooConfig | None:
    """The zoo config whose ``env: id:`` is ``env_id`` (one for ``agent`` when there are several),
    or None (no such file, or no zoo directory: an installed package without the repo)."""
    if not zoo_dir.is_dir():
        return None
    found: list[ZooConfig] = []
    for path in sorted(zoo_dir.glob("*.yaml")):
        try:
            doc = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError, UnicodeDecodeError):
            continue  # a file being written, or not a config: the others still count
        if not isinstance(doc, dict) or _get(doc, "env", "id") != env_id:
            continue
        name, kind = _get(doc, "run", "name"), _get(doc, "agent", "kind")
        found.append(ZooConfig(f"configs/zoo/{path.name}", name, kind))
    return next((z for z in found if z.agent == agent), found[0] if found else None)


def zoo_pointer(
    env_id: str, agent: str | None = None, run_name: str | None = None, zoo_dir: Path = ZOO_DIR
) -> str:
    """What to try next, in the warning's words: the tuned config for the env, or the results page."""
    zoo = zoo_config(env_id, agent, zoo_dir)
    if zoo is None:
        return RESULTS_POINTER
    if run_name is not None and zoo.run_name == run_name:  # the run is the tuned config already
        return f"this is the tuned config ({zoo.path}): docs/results.md says what budget it needs"
    return f"a tuned config for {env_id}: {zoo.path}"


def _get(doc: dict[object, object], section: str, key: str) -> str | None:
    part = doc.get(section)
    value = part.get(key) if isinstance(part, dict) else None
    return value if isinstance(value, str) else None


def stall_message(
    stall: Stall, pointer: str, *, alpha: float | None = None, target: float | None = None
) -> str:
    """The warning for ``stall``: the eval fact, the entropy weight when it collapsed, a target met
    before any learning, and what to try (``pointer``)."""
    parts = [
        f"no new best evaluation for {_duration(stall.seconds)} "
        f"({stall.evaluations} evaluations, best {stall.best:.4g})"
    ]
    if alpha is not None and math.isfinite(alpha) and alpha < ALPHA_COLLAPSED:
        parts.append(f"entropy weight alpha {alpha:.2g} (collapsed)")
    if stall.target_met_first and target is not None:
        parts.append(
            f"learner.target_return {target:g} was met by the first evaluation, before any "
            "learning: it is likely another task's"
        )
    parts.append(pointer)
    return "no progress: " + "; ".join(parts)


def latest_logged(
    path: Path, tag: str, source: str = "learner", tail_bytes: int = TAIL_BYTES
) -> float | None:
    """The latest finite value of ``tag`` written by ``source`` in the end of metrics.jsonl
    ``path`` (None when the file or the tag is not there: a supervisor on another host, a
    learner that has not logged it yet, an agent without it)."""
    try:
        with path.open("rb") as f:
            f.seek(0, 2)
            size = f.tell()
            f.seek(max(0, size - tail_bytes))
            tail = f.read()
    except OSError:
        return None
    needle = f'"{tag}"'.encode()
    for line in reversed(tail.splitlines()):
        if needle not in line:
            continue
        try:
            row = json.loads(line)
        except ValueError:  # the first line of the tail is usually cut
            continue
        if not isinstance(row, dict) or row.get("source") != source or row.get("tag") != tag:
            continue
        value = row.get("value")
        if isinstance(value, (int, float)) and math.isfinite(value):
            return float(value)
    return None


class NoProgressWarning:
    """The no-progress warning of one run, as the supervisor's snapshots carry it: the rule
    (:class:`ProgressWatch`, from the run's config) plus the words, and one WARNING log line when
    a stall begins and one when it clears (not one per snapshot).

    The entropy weight is the learner's heartbeat counter ``alpha`` when it sends one, else the
    latest ``losses/alpha`` in the run's metrics.jsonl (read at most every ALPHA_READ_SECONDS,
    and only while stalled); the zoo directory is scanned once, at the first stall."""

    def __init__(self, cfg: Config, run_dir: Path, *, zoo_dir: Path = ZOO_DIR) -> None:
        self.cfg = cfg
        self.watch = ProgressWatch(cfg.supervisor.no_progress_seconds, cfg.learner.target_return)
        self._metrics = run_dir / "metrics.jsonl"
        self._zoo_dir = zoo_dir
        self._pointer: str | None = None
        self._alpha: tuple[float, float | None] | None = None  # (clock read, value)
        self.text = ""  # the warning now ("" when the run is not stalled)
        self.seconds: float | None = None  # how long without a new best, while stalled

    def update(
        self, now: float, best: float | None, evaluations: float | None, alpha: float | None = None
    ) -> str:
        """The warning as of clock ``now`` ("" when none); see ProgressWatch.observe."""
        stall = self.watch.observe(now, best, evaluations)
        if stall is None:
            if self.text:
                why = "target reached" if self.watch.reached else f"new best evaluation {best:.4g}"
                log.warning("progress again (%s): the no-progress warning is cleared", why)
            self.text, self.seconds = "", None
            return ""
        if self._pointer is None:
            agent = getattr(self.cfg.agent, "kind", None)
            self._pointer = zoo_pointer(self.cfg.env.id, agent, self.cfg.run.name, self._zoo_dir)
        text = stall_message(
            stall,
            self._pointer,
            alpha=alpha if alpha is not None else self._logged_alpha(now),
            target=self.cfg.learner.target_return,
        )
        if not self.text:
            log.warning("%s", text)
        self.text, self.seconds = text, stall.seconds
        return text

    def _logged_alpha(self, now: float) -> float | None:
        if self._alpha is None or now - self._alpha[0] >= ALPHA_READ_SECONDS:
            self._alpha = (now, latest_logged(self._metrics, ALPHA_TAG))
        return self._alpha[1]


def _duration(seconds: float) -> str:
    s = max(0.0, seconds)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
