"""One moment of a run as the operator sees it (``RunSnapshot``), and the builder that makes one
from the supervisor's slots.

The snapshot is plain data, the same for the live dashboard, the progress line and ``zmqrl
status`` (which receives it as msgpack or JSON: ``to_dict`` / ``from_dict``). The builder is the
only stateful part: rates are *recent* (the difference between two heartbeats of the same process
over their time), because the counters' own rates are lifetime averages that hide a slowdown; the
eval history and the "rising" marks need the previous snapshots too.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zmqrl.agents import store_label
from zmqrl.config import Config
from zmqrl.runtime.health import BAD_LATEST_INFO_KEY
from zmqrl.supervisor.liveness import FINAL_STATES
from zmqrl.supervisor.progress_watch import NoProgressWarning
from zmqrl.supervisor.snapshot_fields import finite, from_fields, printable, to_plain
from zmqrl.supervisor.summary import Slot

# Evaluations kept for the sparkline.
EVAL_HISTORY_LEN = 40
# The health counters the dashboard sums over processes; a rise is marked for the operator.
WATCHED_COUNTERS = ("bad_messages", "stale_batches", "lost_batches", "reordered_batches")
# A rise stays marked this long (seconds of the supervisor's clock), so that a dashboard refreshing
# faster than heartbeats arrive does not blink it away.
RISING_HOLD_SECONDS = 5.0
# Counters whose recent rate the builder keeps, and the process's own (lifetime) rate to show
# until two heartbeats of the same process have been seen ("" : counter / duration).
RATE_FALLBACKS = {
    "steps": "steps_per_s",
    "updates": "updates_per_s",
    "samples": "samples_per_s",
    "sample_blocked_seconds": "",
    "insert_blocked_seconds": "",
}
RATE_UNITS = {"actor": "steps/s", "learner": "upd/s", "evaluator": "evals"}
ROLE_ORDER = {"learner": 0, "evaluator": 1, "actor": 2}


@dataclass
class ProcessRow:
    """One process as the dashboard's table shows it."""

    role: str  # "learner" | "actor" | "evaluator"
    id: int
    pid: int | None = None  # None until heard from
    host: str | None = None  # heartbeat info["host"] when the role sends it
    start: str | None = None  # the process's per-start id (heartbeat info["start"]), when it sends one
    state: str = "starting"  # heartbeat state, or "starting", "restarting in 1.5 s", "down", ...
    heartbeat_age: float | None = None  # seconds since its latest heartbeat (None: never heard)
    restarts: int = 0
    rate: float = math.nan  # actor: env steps/s, learner: updates/s, evaluator: evaluations so far
    rate_unit: str = ""  # "steps/s" | "upd/s" | "evals"
    weights_version: int | None = None
    policy_lag: float | None = None  # actor: learner's version - its own; learner: its policy_lag

    @property
    def name(self) -> str:
        return f"{self.role}-{self.id}"


@dataclass
class RunSnapshot:
    """The whole run at one moment. Every field has a default, so a reader of an older or newer
    snapshot (``from_dict``) gets what is there and defaults for the rest."""

    run_dir: str = ""
    state: str = "starting"  # "starting" | "running" | "stopping" | "finished"
    elapsed: float = 0.0  # seconds since launch
    progress: float = 0.0  # 0..1 towards the run's end
    progress_label: str = ""  # e.g. "updates 1200/20000"
    eta_seconds: float | None = None
    processes: list[ProcessRow] = field(default_factory=list)
    train_return: float | None = None  # mean of the actors' recent_return
    eval_return: float | None = None  # latest (the evaluator's when enabled, else the learner's)
    eval_best: float | None = None
    eval_history: list[float] = field(default_factory=list)  # latest evaluations, oldest first
    replay_size: int = 0
    replay_capacity: int = 0
    replay_label: str = "replay"  # "queue": an on-policy run's rollout queue (env steps), not replay
    samples_in_per_s: float = math.nan  # transitions/s arriving at the learner (recent)
    samples_trained_per_s: float = math.nan  # updates/s x batch size (recent)
    replay_ratio: float | None = None  # samples trained / samples in
    limiter_wait_share: float | None = None  # share of recent time the learner waited to sample
    counters: dict[str, int] = field(default_factory=dict)  # WATCHED_COUNTERS and "restarts"
    rising: list[str] = field(default_factory=list)  # names in `counters` that rose just now
    # Additions to the shared contract:
    updates: int = 0
    max_updates: int = 0
    samples: int = 0  # transitions the learner received
    actors_alive: int = 0
    insert_wait_share: float | None = None  # share of recent time the learner's ingest was held back
    rises: dict[str, int] = field(default_factory=dict)  # for each name in `rising`, by how much
    no_progress: str = ""  # the no-progress warning and what to try (supervisor.no_progress_seconds)
    no_progress_seconds: float | None = None  # seconds without a new best evaluation, while warned
    bad_latest: str = ""  # why the learner dropped its newest bad message (its heartbeat says)

    @property
    def replay_fill(self) -> float | None:
        return self.replay_size / self.replay_capacity if self.replay_capacity > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """JSON- and msgpack-safe: NaN and infinities become None."""
        out: dict[str, Any] = to_plain(dataclasses.asdict(self))
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSnapshot:
        """The snapshot ``d`` describes; missing keys take defaults, unknown keys are ignored,
        a value of the wrong type raises ValueError."""
        values = from_fields(cls, d, skip=("processes",))
        rows = d.get("processes", []) if isinstance(d, Mapping) else []
        if not isinstance(rows, list):
            raise ValueError(f"processes: expected a list, got {type(rows).__name__}")
        processes = [ProcessRow(**from_fields(ProcessRow, row)) for row in rows]
        return cls(**values, processes=processes)


@dataclass
class _Track:
    """What the builder remembers of one slot's latest heartbeat."""

    pid: int
    time: float
    values: dict[str, float]
    rates: dict[str, float]


class SnapshotBuilder:
    """Keeps what one snapshot needs from the previous ones (rate marks, eval history, counters).

    Call ``build`` as often as the view refreshes; heartbeats already seen change nothing."""

    def __init__(
        self, cfg: Config, run_dir: Path, launched: float, *, wall_clock: Callable[[], float] = time.time
    ) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.launched = launched
        self._wall = wall_clock
        self._tracks: dict[str, _Track] = {}
        self._history: deque[float] = deque(maxlen=EVAL_HISTORY_LEN)
        self._eval_mark: tuple[int, float, float] | None = None  # (pid, evaluations, return)
        self._banked: dict[str, dict[str, int]] = {}  # counts of a slot's earlier processes
        self._seen: dict[str, tuple[int, dict[str, int]]] = {}  # (pid, counts) of its latest
        self._totals: dict[str, int] = {}
        self._rose: dict[str, tuple[float, int]] = {}  # name -> (clock of latest rise, rise shown)
        self.no_progress = NoProgressWarning(cfg, run_dir)

    def build(self, slots: Mapping[str, Slot], now: float, *, state: str = "running") -> RunSnapshot:
        """``now``: the supervisor's monotonic clock (the one ``Slot.live.last_seen`` uses)."""
        for name, slot in slots.items():
            self._track(name, slot)
        learner = slots.get("learner-0")
        lc: Mapping[str, float | int] = learner.last.counters if learner and learner.last else {}
        linfo: Mapping[str, str] = learner.last.info if learner and learner.last else {}
        lrates = self._tracks[learner.name].rates if learner and learner.name in self._tracks else {}
        version = lc.get("weights_version")
        rows = sorted(
            (self._row(name, s, now, version) for name, s in slots.items()),
            key=lambda r: (ROLE_ORDER.get(r.role, 3), r.role, r.id),
        )
        ev = self._eval_source(slots)
        evc: Mapping[str, float | int] = ev.last.counters if ev is not None and ev.last else {}
        if ev is not None and ev.last is not None:
            self._note_eval(ev.last.pid, evc)
        stalled = self.watch_progress(slots, now)
        actors = [s for s in slots.values() if s.role == "actor"]
        returns = [finite(a.last.counters.get("recent_return")) for a in actors if a.last is not None]
        train = [r for r in returns if r is not None]
        samples_in = lrates.get("samples", math.nan)
        batch = getattr(self.cfg.agent, "batch_size", None)
        upd_s = lrates.get("updates", math.nan)
        trained = upd_s * batch if isinstance(batch, int) else math.nan
        updates = int(finite(lc.get("updates")) or 0)
        progress, label, eta = self._progress(updates, lc, upd_s)
        counters = self._counters(slots)
        rising = self._rising(counters, now)
        return RunSnapshot(
            run_dir=str(self.run_dir),
            state=state,
            elapsed=max(0.0, self._wall() - self.launched),
            progress=progress,
            progress_label=label,
            eta_seconds=eta,
            processes=rows,
            train_return=sum(train) / len(train) if train else None,
            eval_return=finite(evc.get("eval_return")),
            eval_best=finite(evc.get("eval_best")),
            eval_history=list(self._history),
            replay_size=int(finite(lc.get("replay_size")) or 0),
            replay_capacity=int(finite(lc.get("replay_capacity")) or 0),  # the learner sizes its store
            replay_label=store_label(self.cfg.agent),
            samples_in_per_s=samples_in,
            samples_trained_per_s=trained,
            replay_ratio=trained / samples_in if samples_in > 0 and math.isfinite(trained) else None,
            limiter_wait_share=_share(lrates.get("sample_blocked_seconds")),
            counters=counters,
            rising=sorted(rising),
            updates=updates,
            max_updates=self.cfg.learner.max_updates,
            samples=int(finite(lc.get("samples")) or 0),
            actors_alive=sum(1 for r in rows if r.role == "actor" and _alive(r.state)),
            insert_wait_share=_share(lrates.get("insert_blocked_seconds")),
            rises=rising,
            no_progress=stalled,
            no_progress_seconds=self.no_progress.seconds,
            bad_latest=printable(linfo.get(BAD_LATEST_INFO_KEY)),
        )

    def watch_progress(self, slots: Mapping[str, Slot], now: float) -> str:
        """The no-progress warning ("" when none) as of the evaluations heard by ``now``: from every
        build, and from every turn of the supervisor's loop (RunMonitor.refresh), so that the
        watch sees the run's first evaluation as the first whatever the view's refresh rate."""
        ev, learner = self._eval_source(slots), slots.get("learner-0")
        evc: Mapping[str, float | int] = ev.last.counters if ev is not None and ev.last else {}
        alpha = finite(learner.last.counters.get("alpha")) if learner and learner.last else None
        return self.no_progress.update(
            now, finite(evc.get("eval_best")), finite(evc.get("evaluations")), alpha
        )

    def recent_rate(self, name: str, counter: str) -> float:
        """``counter`` (one of RATE_FALLBACKS) per second for slot ``name`` as of the latest
        ``build``; 0 when not measured (the supervisor's scalars sum these)."""
        track = self._tracks.get(name)
        return track.rates.get(counter, 0.0) if track is not None else 0.0

    # ------------------------------------------------------------------ per process
    def _track(self, name: str, slot: Slot) -> None:
        """Recent rates from this heartbeat and the previous one of the same process; the
        process's own rates for a new process; unchanged when no new heartbeat came."""
        hb = slot.last
        if hb is None:
            return
        values = {k: v for k in RATE_FALLBACKS if (v := finite(hb.counters.get(k))) is not None}
        old = self._tracks.get(name)
        if old is not None and old.pid == hb.pid and hb.time <= old.time:
            return
        if old is None or old.pid != hb.pid:
            duration = finite(hb.counters.get("duration"))
            rates = {}
            for key, own in RATE_FALLBACKS.items():
                if own:
                    rates[key] = finite(hb.counters.get(own)) or 0.0
                elif key in values and duration:
                    rates[key] = values[key] / duration
        else:
            dt = hb.time - old.time
            rates = {k: max(0.0, (v - old.values[k]) / dt) for k, v in values.items() if k in old.values}
        self._tracks[name] = _Track(hb.pid, hb.time, values, rates)

    def _row(self, name: str, slot: Slot, now: float, learner_version: float | int | None) -> ProcessRow:
        live, hb = slot.live, slot.last
        heard = live.last_seen is not None and hb is not None
        c: Mapping[str, float | int] = hb.counters if hb is not None and heard else {}
        track = self._tracks.get(name)
        rates = track.rates if track is not None and heard else {}
        version = finite(c.get("weights_version"))
        lag: float | None = None
        if slot.role == "learner":
            lag = finite(c.get("policy_lag"))
        elif version is not None and (lv := finite(learner_version)) is not None:
            lag = max(0.0, lv - version)
        if slot.role == "actor":
            rate = rates.get("steps", math.nan)
        elif slot.role == "learner":
            rate = rates.get("updates", math.nan)
        else:
            rate = float(finite(c.get("evaluations")) or 0) if heard else math.nan
        host = hb.info.get("host") if hb is not None and heard else None
        return ProcessRow(
            role=slot.role,
            id=slot.id,
            pid=live.pid if live.pid is not None else (hb.pid if hb is not None and heard else None),
            host=host if isinstance(host, str) else None,
            start=live.start,
            state=self._state(slot, now),
            heartbeat_age=max(0.0, now - live.last_seen) if live.last_seen is not None else None,
            restarts=slot.restarts,
            rate=rate,
            rate_unit=RATE_UNITS.get(slot.role, ""),
            weights_version=int(version) if version is not None else None,
            policy_lag=lag,
        )

    def _state(self, slot: Slot, now: float) -> str:
        live = slot.live
        heard = live.last_seen is not None and slot.last is not None
        final = slot.last.state if heard and slot.last and slot.last.state in FINAL_STATES else None
        if slot.restart_at is not None:
            return f"restarting in {max(0.0, slot.restart_at - now):.1f} s"
        if slot.exit_code is not None and slot.exit_code != 0:
            return "given up" if slot.retired else "down"
        if slot.exit_code == 0 or (slot.retired and final is None):
            return final or "finished"
        if not heard:
            return "starting"
        assert live.last_seen is not None and slot.last is not None
        if final is None and now - live.last_seen > self.cfg.supervisor.heartbeat_timeout:
            return "down"
        return slot.last.state

    # ------------------------------------------------------------------ run-wide figures
    def _eval_source(self, slots: Mapping[str, Slot]) -> Slot | None:
        return slots.get("evaluator-0" if self.cfg.evaluator.enabled else "learner-0")

    def _note_eval(self, pid: int, c: Mapping[str, float | int]) -> None:
        """Append the latest return when the evaluation count rose (a new process starts from
        zero), or, for a source without a count, when the return changed."""
        ret = finite(c.get("eval_return"))
        count = finite(c.get("evaluations"))
        mark = self._eval_mark
        if count is not None:
            before = mark[1] if mark is not None and mark[0] == pid else 0.0
            new = ret is not None and count > before
        else:
            new = ret is not None and (mark is None or ret != mark[2])
        if new and ret is not None:
            self._history.append(ret)
        if count is not None or new:
            self._eval_mark = (pid, math.nan if count is None else count, math.nan if ret is None else ret)

    def _progress(
        self, updates: int, lc: Mapping[str, float | int], upd_s: float
    ) -> tuple[float, str, float | None]:
        """Towards learner.max_updates, or learner.max_seconds when that ends the run sooner."""
        lcfg = self.cfg.learner
        by_updates = min(1.0, updates / lcfg.max_updates)
        eta = max(0.0, lcfg.max_updates - updates) / upd_s if upd_s > 0 else None
        duration = finite(lc.get("duration"))  # the learner's training seconds
        if lcfg.max_seconds and duration is not None:
            by_time = min(1.0, duration / lcfg.max_seconds)
            time_left = max(0.0, lcfg.max_seconds - duration)
            # Without a rate to tell which limit comes first, the one nearer its end drives.
            sooner = time_left < eta if eta is not None else by_time > by_updates
            if sooner:
                return by_time, f"time {duration:.0f}/{lcfg.max_seconds:.0f} s", time_left
        return by_updates, f"updates {updates}/{lcfg.max_updates}", eta

    def _counters(self, slots: Mapping[str, Slot]) -> dict[str, int]:
        """Health counters summed over processes, counting those of a slot's earlier processes
        too: a restarted process counts from zero, which must not hide or fake a rise."""
        for name, slot in slots.items():
            hb = slot.last
            if hb is None:
                continue
            counts = {k: int(finite(hb.counters.get(k)) or 0) for k in WATCHED_COUNTERS}
            seen = self._seen.get(name)
            if seen is not None and seen[0] != hb.pid:
                bank = self._banked.setdefault(name, {})
                for k, v in seen[1].items():
                    bank[k] = bank.get(k, 0) + v
            self._seen[name] = (hb.pid, counts)
        totals = {k: 0 for k in WATCHED_COUNTERS}
        for name, (_, counts) in self._seen.items():
            bank = self._banked.get(name, {})
            for k in WATCHED_COUNTERS:
                totals[k] += counts[k] + bank.get(k, 0)
        totals["restarts"] = sum(s.restarts for s in slots.values())
        return totals

    def _rising(self, counters: dict[str, int], now: float) -> dict[str, int]:
        """Names that rose within RISING_HOLD_SECONDS, with the rise since they began rising."""
        for name, value in counters.items():
            before = self._totals.get(name)
            if before is not None and value > before:
                at, shown = self._rose.get(name, (-math.inf, 0))
                self._rose[name] = (now, (shown if now - at < RISING_HOLD_SECONDS else 0) + value - before)
        self._totals = dict(counters)
        return {n: r for n, (at, r) in self._rose.items() if now - at < RISING_HOLD_SECONDS}


def _share(rate: float | None) -> float | None:
    """Seconds waited per second, as a share of the time (None when not measured)."""
    value = finite(rate)
    return min(1.0, max(0.0, value)) if value is not None else None


def _alive(state: str) -> bool:
    return not (state in ("down", "given up", *FINAL_STATES) or state.startswith("restarting"))
