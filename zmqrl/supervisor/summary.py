"""What a supervisor writes when a run ends: the final summary on the console and ``stats.json``
(what it shows while the run goes is ``supervisor/monitor.py``'s). Shared by ``launch``
(processes it started) and the watch-only ``supervise`` (processes it only hears), so both show
the same view."""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from zmqrl import strictjson
from zmqrl.checkpoints.choice import choose_deployment, deploy_line, stopped_at_target_line
from zmqrl.config import Config
from zmqrl.learner.stopping import ended_words
from zmqrl.metrics import fmt_value
from zmqrl.supervisor.liveness import Liveness
from zmqrl.supervisor.restarts import NEEDS_OPERATOR, CrashRecord, Death, Decision
from zmqrl.transport.control import TARGET_HELD
from zmqrl.transport.wire import HeartbeatMsg

# The final summary as the supervisor printed it, kept in the run directory for `zmqrl status`.
SUMMARY_TEXT = "summary.txt"


@dataclass
class Slot:
    """One place in the run (the learner, actor i, the evaluator) and what is known of the
    process filling it now. ``pid`` is None until heard from, for processes a watcher did not start."""

    role: str
    id: int
    live: Liveness
    log_path: Path | None = None
    exit_code: int | None = None
    retired: bool = False  # no longer watched: finished on its own, out of restarts, or gone
    restart_at: float | None = None  # clock() at which a failed slot is started again
    restart_times: list[float] = field(default_factory=list)  # clock() of this slot's restarts
    # Restarts counted before this supervisor started (a restarted `supervise`: its run's record).
    carried_restarts: int = 0
    crashes: CrashRecord = field(default_factory=CrashRecord)  # carried to each replacement
    # How its last process ended, in the summary's words: finished, stopped, given up, killed, ...
    end: str | None = None

    @property
    def last(self) -> HeartbeatMsg | None:
        return self.live.last

    @property
    def restarts(self) -> int:
        return self.carried_restarts + len(self.restart_times)

    @property
    def name(self) -> str:
        return f"{self.role}-{self.id}"


def read_stats_file(path: Path, fallback: HeartbeatMsg | None) -> dict[str, Any]:
    """A role's own final stats file if it wrote one, else its last heartbeat's counters."""
    if path.is_file():
        try:
            return dict(json.loads(path.read_text()))
        except (OSError, ValueError):
            pass
    return dict(fallback.counters) if fallback is not None else {}


class Reporter:
    """The final summary for one run (and the learner's counters when the target was reached)."""

    def __init__(self, cfg: Config, run_dir: Path, out: TextIO, say: Callable[[str], None]) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self._out = out
        self._say = say
        # The learner's counters when the evaluator first reported the target return.
        self.target_at_learner: dict[str, Any] | None = None
        # Set once the evaluator reports the target held and learner.stop_at_target is on: the
        # supervisor then asks the learner to end the run (ControlPublisher.request_end).
        self.end_request: str | None = None

    def heard(self, slots: Mapping[str, Slot], hb: HeartbeatMsg) -> None:
        if hb.role == "evaluator":
            self._heard_evaluator(slots, hb)

    def _heard_evaluator(self, slots: Mapping[str, Slot], hb: HeartbeatMsg) -> None:
        """The evaluator's heartbeats say when it first reached, and held, the target return. With
        ``learner.stop_at_target`` the evaluator decides the end, but only the learner can end
        the run (its final checkpoint, its exit 0): so the supervisor carries the word, which
        is at most a heartbeat interval late (the learner trains on meanwhile; ``best`` holds the
        weights that held the target)."""
        lcfg = self.cfg.learner
        if (
            self.end_request is None
            and lcfg.stop_at_target
            and self.cfg.evaluator.enabled
            and math.isfinite(hb.counters.get("target_held_time", math.nan))
        ):
            self.end_request = TARGET_HELD
            self._say(
                f"the evaluator held target return {lcfg.target_return:g} for {lcfg.target_hold} "
                "evaluations in a row: ending the run (learner.stop_at_target)"
            )
        if self.target_at_learner is None:
            reached = hb.counters.get("target_time", math.nan)
            learner = slots.get("learner-0")
            if math.isfinite(reached) and learner is not None and learner.last is not None:
                # The evaluator knows weights versions, not env steps: take the learner's
                # counters from the moment the evaluator said so (a heartbeat apart at most).
                self.target_at_learner = dict(learner.last.counters)

    # ------------------------------------------------------------------ final summary
    def final(self, slots: Mapping[str, Slot], extra: dict[str, Any]) -> dict[str, Any]:
        """Print the summary and write ``stats.json``; ``extra`` carries the supervisor's own
        figures (launch time, wall and shutdown seconds, its bad-message counts)."""
        learner_slot = slots.get("learner-0")
        learner_stats = read_stats_file(
            self.run_dir / "learner-stats.json", learner_slot.last if learner_slot else None
        )
        actors = sorted((s for s in slots.values() if s.role == "actor"), key=lambda s: s.id)
        rows = [self._actor_row(a) for a in actors]
        summary: dict[str, Any] = {
            **extra,
            "learner": {
                **learner_stats,
                "restarts": learner_slot.restarts,
                "exit_code": learner_slot.exit_code,
                "end": learner_slot.end or "unknown",
            }
            if learner_slot
            else learner_stats,
            "actors": rows,
        }
        evaluator = slots.get("evaluator-0")
        if evaluator is not None:
            ev = read_stats_file(self.run_dir / "evaluator-stats.json", evaluator.last)
            summary["evaluator"] = {
                **ev,
                "restarts": evaluator.restarts,
                "exit_code": evaluator.exit_code,
                "end": evaluator.end or "unknown",
            }
        scorer = summary.get("evaluator", {}) if self.cfg.evaluator.enabled else None
        summary["deploy"] = choose_deployment(self.run_dir, learner_stats, scorer).to_dict()
        # Printed once into a buffer: the console gets it, and SUMMARY_TEXT keeps it for `zmqrl
        # status` after the run (from another container or host, the console is out of reach).
        console, buffer = self._out, io.StringIO()
        self._out = buffer
        try:
            self._print(summary, learner_stats, rows, extra, summary.get("evaluator", {}))
            text = buffer.getvalue()
        finally:
            self._out = console
        console.write(text)
        console.flush()
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "stats.json").write_text(strictjson.dumps(summary, indent=2))
        (self.run_dir / SUMMARY_TEXT).write_text(text.lstrip("\n"))
        return summary

    @staticmethod
    def _actor_row(a: Slot) -> dict[str, Any]:
        c = a.last.counters if a.last else {}
        return {
            "actor_id": a.id,
            "samples": int(c.get("samples", 0)),
            "samples_per_s": float(c.get("samples_per_s", 0)),
            "duration": float(c.get("duration", 0.0)),
            "steps": int(c.get("steps", 0)),
            "episodes": int(c.get("episodes", 0)),
            "weights_version": int(c.get("weights_version", 0)),
            "epsilon": float(c.get("epsilon", float("nan"))),
            "restarts": a.restarts,
            "exit_code": a.exit_code,
            "state": a.last.state if a.last else "unknown",
            "end": a.end or "unknown",
        }

    def _print(
        self,
        summary: dict[str, Any],
        ls: dict[str, Any],
        rows: list[dict[str, Any]],
        extra: dict[str, Any],
        ev: dict[str, Any],
    ) -> None:
        out = self._out
        launched = float(extra.get("launched", 0.0))
        print("\n== learner ==", file=out)
        learner_end = summary["learner"].get("end") if isinstance(summary.get("learner"), dict) else None
        if learner_end not in (None, "unknown"):
            print(f"learner {ended_words(learner_end, ls.get('ended'))}", file=out)
        if ls:
            print(
                f"updates {int(ls.get('updates', 0))} | samples received {int(ls.get('samples', 0))} | "
                f"{ls.get('updates_per_s', 0.0):.1f} updates/s | "
                f"{ls.get('samples_per_s', 0.0):.1f} samples/s | "
                f"duration {ls.get('duration', 0.0):.1f} s | bad messages {int(ls.get('bad_messages', 0))}",
                file=out,
            )
            keys = ("policy_lag", "samples_per_insert", "sample_blocked_seconds", "insert_blocked_seconds")
            more = [
                f"{key.replace('_', ' ')} {fmt_value(ls[key])}"
                for key in keys
                if isinstance(ls.get(key), (int, float))
                and math.isfinite(float(ls[key]))
                and float(ls[key]) > 0
            ]
            if int(ls.get("stale_batches", 0)):
                more.append(f"stale batches dropped {int(ls['stale_batches'])}")
            if more:
                print(" | ".join(more), file=out)
            if self.cfg.evaluator.enabled:
                self._print_evaluator(launched, ev)
            else:
                print(
                    f"eval return: last {fmt_value(ls.get('eval_return'))}, "
                    f"best {fmt_value(ls.get('eval_best'))}",
                    file=out,
                )
            target = None if self.cfg.evaluator.enabled else self.cfg.learner.target_return
            when = ls.get("target_time")
            if target is not None and isinstance(when, (int, float)) and _finite(when):
                print(
                    f"target return {target:g} first reached {when - launched:.1f} s after launch "
                    f"({int(ls['target_samples'])} env steps, {int(ls['target_updates'])} updates)",
                    file=out,
                )
                self._print_held(launched, ls.get("target_held_time"), ls)
            elif target is not None:
                print(f"target return {target:g} not reached", file=out)
            self._print_stopped_at_target(ls, ev)
        else:
            print("no stats (the learner did not report)", file=out)
        print("\n== actors ==", file=out)
        print(
            f"{'actor_id':>8} {'samples':>10} {'samples/sec':>12} {'duration':>9} {'episodes':>9} "
            f"{'weights_v':>9} {'restarts':>8}  end",
            file=out,
        )
        for r in rows:
            print(
                f"{r['actor_id']:>8} {r['samples']:>10} {r['samples_per_s']:>12.1f} {r['duration']:>8.1f}s "
                f"{r['episodes']:>9} {r['weights_version']:>9} {r['restarts']:>8}  {r['end']}",
                file=out,
            )
        bad = int(extra.get("bad_messages", 0))
        if bad:
            print(f"\nsupervisor: {bad} malformed heartbeat/control message(s) dropped", file=out)
        if dropped := extra.get("bad_control"):  # by the roles, on the control channel
            each = ", ".join(f"{name} {n}" for name, n in sorted(dropped.items()))
            print(f"control messages dropped by roles (malformed or forged): {each}", file=out)
        if stalled := extra.get("no_progress"):  # still standing at the end: what to try next
            print(f"\nwarning: {stalled}", file=out)
        outcome = extra.get("outcome")
        if outcome:
            print(f"\nrun {outcome}", file=out)
        print(
            f"\nshutdown took {float(extra.get('shutdown_seconds', math.nan)):.2f} s; "
            f"stats in {self.run_dir / 'stats.json'}",
            file=out,
        )
        print(deploy_line(summary["deploy"]), file=out, flush=True)

    def _print_stopped_at_target(self, ls: dict[str, Any], ev: dict[str, Any]) -> None:
        """Why a run that ended early ended: the record that completed the held streak is the
        evaluator's when it evaluated, else the learner's."""
        held = (ev if self.cfg.evaluator.enabled else ls).get("target_held")
        target = self.cfg.learner.target_return
        if ls.get("ended") != TARGET_HELD or target is None:
            return
        if not isinstance(held, dict):
            held = {}  # the evaluator's stats are missing: say it without the time
        print(stopped_at_target_line(target, self.cfg.learner.target_hold, held), file=self._out)

    def _print_evaluator(self, launched: float, ev: dict[str, Any]) -> None:
        out = self._out
        print(
            f"evaluator: {int(ev.get('evaluations', 0))} evaluations, "
            f"last {fmt_value(ev.get('eval_return'))} "
            f"(weights v{int(ev.get('evaluated_version', 0))}), best {fmt_value(ev.get('eval_best'))}",
            file=out,
        )
        target = self.cfg.learner.target_return
        when = ev.get("target_time")
        if target is not None and isinstance(when, (int, float)) and math.isfinite(when):
            at = self.target_at_learner or {}
            where = (
                f" (about {int(at['samples'])} env steps, {int(at['updates'])} updates)"
                if {"samples", "updates"} <= at.keys()
                else ""
            )
            print(
                f"target return {target:g} first reached {when - launched:.1f} s after launch{where}",
                file=out,
            )
            history = ev.get("eval_history") or []
            held: dict[str, Any] = next(
                (r for r in history if r.get("time") == ev.get("target_held_time")), {}
            )
            steps = {"target_held_samples": held.get("env_steps")} if held else {}
            self._print_held(launched, ev.get("target_held_time"), steps)
        elif target is not None:
            print(f"target return {target:g} not reached", file=out)

    def _print_held(self, launched: float, when: Any, figures: dict[str, Any]) -> None:
        """The figure that means success: the target held for learner.target_hold evaluations."""
        hold = self.cfg.learner.target_hold
        if not _finite(when):
            print(f"target return not held for {hold} evaluations in a row", file=self._out)
            return
        at = [
            f"{int(figures[key])} {what}"
            for key, what in (("target_held_samples", "env steps"), ("target_held_updates", "updates"))
            if _finite(figures.get(key))
        ]
        where = f" ({', '.join(at)})" if at else ""
        print(
            f"target return held for {hold} evaluations in a row from {when - launched:.1f} s "
            f"after launch{where}",
            file=self._out,
        )


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def given_up_line(slot: Slot, death: Death, decision: Decision, run_dir: Path, last_error: str | None) -> str:
    """What the console says when a slot is given up: which role, why and how often, the last
    error line of its log, and what the run does now."""
    where = f"see {slot.log_path}" if last_error is None else f"last error in {slot.log_path}: {last_error}"
    if death.kind == NEEDS_OPERATOR:
        what = f"{slot.name} {death.why}, which restarting cannot fix ({where})"
    else:
        counted = slot.crashes.counted
        span = counted[-1] - counted[0] if counted else 0.0
        what = (
            f"{slot.name} failed {len(counted)} times in {span:.0f} s without a healthy run, "
            f"a crash loop (the last one: {death.why}; {where})"
        )
    if slot.role == "learner":
        return (
            f"error: {what}; stopping the run. Its latest checkpoint is in {run_dir / 'checkpoints'}: "
            f"fix the cause, then `zmqrl launch --resume {run_dir}`"
        )
    return f"warning: {what}; the run goes on without it (degraded)"


def restart_line(slot: Slot, death: Death, decision: Decision) -> str:
    """What the console says when a process that ended is about to be started again."""
    assert decision.delay is not None
    what = "from its latest checkpoint " if slot.role == "learner" else ""
    return f"warning: {slot.name} {death.why} ({decision.why}); restarting it {what}in {decision.delay:.1f} s"
