"""The study: where it is stored, how trials are run, counted and recovered.

Counting: ``--trials N`` means N trials that ended COMPLETE or PRUNED, in the whole study (every
tuner sharing it). A failed trial (a run that crashed, or was interrupted) does not count; so a
resumed study runs until N have ended, never more because of a restart, never fewer.

Recovery, so that no trial is lost or counted twice:

- Ctrl-C (or SIGTERM) in the tuner stops the running trial's run, marks the trial FAIL with the
  user attribute ``interrupted`` and enqueues its parameters again: the next ``zmqrl tune`` with
  the same study retries that very point first.
- A tuner killed outright (SIGKILL, a crash, a reboot) leaves its trial RUNNING. Each trial
  records its tuner (host, pid, the pid's start time); a tuner starting on the same host marks
  such a trial FAIL (``abandoned``) and enqueues its parameters again when that tuner is gone.
  On a shared database (not SQLite), trials also beat a heartbeat, and any tuner fails and
  re-enqueues one whose heartbeat stopped for ``GRACE_SECONDS``, so a host that never comes back
  does not hold a trial forever.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import re
import socket
import statistics
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import optuna
from optuna.trial import FrozenTrial, Trial, TrialState

from zmqrl.tune.interrupts import INTERRUPTS
from zmqrl.tune.objective import EvalPoint, NoEvaluations, final_value, running_value
from zmqrl.tune.space import Param, Space
from zmqrl.tune.trial import RunSpec, TrialRun

DB_FILE = "study.db"
TRIALS_DIR = "trials"
ENDED = (TrialState.COMPLETE, TrialState.PRUNED)
HEARTBEAT_SECONDS = 30
GRACE_SECONDS = 120
# Tries at creating Optuna's tables when another tuner may be creating them at the same moment.
SCHEMA_ATTEMPTS = 3
# Consecutive failed trials of one tuner after which it gives up: the space or config is broken.
MAX_FAILURES_IN_A_ROW = 3
# Exit codes of a run that ended by itself (0) or was stopped by the tuner's SIGTERM (143).
FINISHED, STOPPED = 0, 143


class TrialFailed(RuntimeError):
    """A trial's run crashed or refused to start; its log says why."""


@dataclass(frozen=True)
class Setup:
    """What every trial of this tuner shares."""

    space: Space
    config: Path
    overrides: list[str]  # the command line's --set, before the space's
    tune_dir: Path
    serial: bool
    target: float | None  # time_to_target's target


def storage_url(tune_dir: Path, storage: str | None) -> str:
    """The storage: ``storage`` as given (any Optuna/SQLAlchemy URL), else SQLite in the tune dir.

    A PostgreSQL URL without a driver (``postgresql://``) gets psycopg 3, the driver the
    ``tune-postgres`` extra installs: SQLAlchemy's default for it changed (psycopg2 up to 2.0,
    psycopg from 2.1), and the same URL must work on every host whatever SQLAlchemy it has."""
    if storage is None:
        return f"sqlite:///{(tune_dir / DB_FILE).resolve()}"
    return re.sub(r"^postgres(ql)?://", "postgresql+psycopg://", storage)


def shown_url(url: str) -> str:
    """``url`` fit to print: a database password never reaches a terminal or a CI log."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:  # not a URL SQLAlchemy reads: Optuna will say so, without it
        return url.split("@")[-1]


def open_study(setup: Setup, name: str, url: str) -> optuna.Study:
    """Create the study, or load it when it exists (resuming; another host's tuner)."""
    heartbeat: dict[str, Any] = {}
    if not url.startswith("sqlite"):
        # Optuna 4.9 renamed the callback; older ones know only the first name.
        takes = inspect.signature(optuna.storages.RDBStorage).parameters
        callback = (
            "heartbeat_stale_trial_callback"
            if "heartbeat_stale_trial_callback" in takes
            else "failed_trial_callback"
        )
        heartbeat = {"heartbeat_interval": HEARTBEAT_SECONDS, "grace_period": GRACE_SECONDS, callback: _retry}
    storage = _storage(url, heartbeat)
    pruner = _pruner(setup.space)
    sampler = optuna.samplers.TPESampler(seed=setup.space.sampler_seed)
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        direction="maximize" if setup.space.objective.direction == "maximize" else "minimize",
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    fingerprint = hashlib.sha256(setup.space.path.read_bytes() + setup.config.read_bytes()).hexdigest()
    known = study.user_attrs.get("fingerprint")
    if known is None:
        study.set_user_attr("fingerprint", fingerprint)
        study.set_user_attr("config", str(setup.config))
        for values in setup.space.first_trials:
            study.enqueue_trial(_encoded(setup.space, values), skip_if_exists=True)
    elif known != fingerprint:
        raise ValueError(
            f"study {name!r} in {url} was made from another space file or config "
            f"(it was {study.user_attrs.get('config')}): give another --study name or --storage"
        )
    return study


def _storage(url: str, heartbeat: dict[str, Any]) -> optuna.storages.RDBStorage:
    """Optuna's storage, its tables created if the database has none. Tuners started together on
    a fresh database race to create them (two CREATE TYPE at once: a unique violation for one of
    them); the loser finds them made when it tries again."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    for attempt in range(SCHEMA_ATTEMPTS):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # heartbeats are
                return optuna.storages.RDBStorage(url, **heartbeat)
        except (IntegrityError, ProgrammingError):
            if attempt == SCHEMA_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _pruner(space: Space) -> optuna.pruners.BasePruner:
    spec = space.pruner
    if spec.kind == "median":
        return optuna.pruners.MedianPruner(
            n_startup_trials=spec.startup_trials, n_warmup_steps=spec.warmup_evaluations
        )
    if spec.kind == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=max(1, spec.warmup_evaluations))
    return optuna.pruners.NopPruner()


def recover_abandoned(study: optuna.Study, out: TextIO) -> int:
    """Fail and re-enqueue this host's RUNNING trials whose tuner is gone; returns how many."""
    recovered = 0
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get("tuner") or {}
        if owner.get("host") != socket.gethostname() or _alive(owner.get("pid"), owner.get("started")):
            continue
        try:  # the attribute first: a finished trial takes none
            study._storage.set_trial_user_attr(trial._trial_id, "abandoned", True)
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except RuntimeError:  # another tuner on this host got to it first
            continue
        _retry(study, trial)
        out.write(
            f"trial {trial.number}: its tuner (pid {owner.get('pid')}) is gone; "
            "marked failed, its parameters enqueued again\n"
        )
        recovered += 1
    return recovered


def _retry(study: optuna.Study, trial: FrozenTrial) -> None:
    study.enqueue_trial(dict(trial.params), user_attrs={"retry_of": trial.number})


def ended(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=ENDED))


def run_trials(study: optuna.Study, setup: Setup, n_trials: int, out: TextIO) -> int:
    """Run trials until the study holds ``n_trials`` ended ones (counting those other tuners run
    now); returns how many this tuner ran. KeyboardInterrupt propagates after the trial is saved."""
    objective = TrialObjective(setup, out)
    ran = failures = 0
    while True:
        running = len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))
        if ended(study) + running >= n_trials:
            return ran
        study.optimize(objective, n_trials=1, catch=(TrialFailed, NoEvaluations))
        INTERRUPTS.check()  # a signal that came while Optuna saved the trial: it is saved now
        ran += 1
        last = study._storage.get_trial(objective.last_trial_id)
        failures = failures + 1 if last.state == TrialState.FAIL else 0
        out.write(f"{ended(study)} of {n_trials} trials ended{_best_so_far(study, setup.space)}\n")
        out.flush()
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise TrialFailed(f"{failures} trials in a row failed; the last one's log: {objective.last_log}")


def _best_so_far(study: optuna.Study, space: Space) -> str:
    if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        return ""
    best = study.best_trial
    return f"; best so far: trial {best.number}, {space.objective.metric} {best.value:.4g}"


class TrialObjective:
    """Optuna's objective: sample, launch one run per seed, report evaluations, score."""

    def __init__(self, setup: Setup, out: TextIO) -> None:
        self.setup = setup
        self.out = out
        self.last_trial_id = -1
        self.last_log = Path()

    def __call__(self, trial: Trial) -> float:
        self.last_trial_id = trial._trial_id
        trial.set_user_attr(
            "tuner", {"host": socket.gethostname(), "pid": os.getpid(), "started": _start_time(os.getpid())}
        )
        space = self.setup.space
        values = {p.key: suggest(trial, p) for p in space.params}
        shown = " ".join(f"{k}={_short(v)}" for k, v in values.items())
        scores = []
        try:
            for index, seed in enumerate(space.seeds):
                name = f"trial-{trial.number:04d}" + (f"-seed{seed}" if len(space.seeds) > 1 else "")
                run_dir = (self.setup.tune_dir / TRIALS_DIR / name).resolve()
                self.last_log = run_dir.with_suffix(".log")
                trial.set_user_attr(f"run_dir_seed{seed}", str(run_dir))
                self.out.write(f"trial {trial.number} started (seed {seed}): {shown} -> {run_dir}\n")
                self.out.flush()
                overrides = [*self.setup.overrides, *space.overrides(values), f"run.seed={seed}"]
                spec = RunSpec(self.setup.config, overrides, run_dir, self.last_log, self.setup.serial)
                report = self._reporter(trial) if index == 0 else (lambda points: False)
                with TrialRun(spec) as run, INTERRUPTS.following():
                    outcome = run.follow(report)
                if outcome.pruned:
                    self.out.write(f"trial {trial.number} pruned at evaluation {len(outcome.points)}\n")
                    raise optuna.TrialPruned(f"at evaluation {len(outcome.points)}")
                if outcome.code != FINISHED:
                    raise TrialFailed(
                        f"trial {trial.number}: the run exited {outcome.code}: see {self.last_log}"
                    )
                scores.append(
                    final_value(space.objective, outcome.points, self.setup.target, outcome.seconds)
                )
        except KeyboardInterrupt:
            trial.set_user_attr("interrupted", True)
            _retry(trial.study, trial.study._storage.get_trial(trial._trial_id))
            self.out.write(
                f"trial {trial.number} interrupted: marked failed, its parameters enqueued again\n"
            )
            raise
        score = statistics.fmean(scores)
        self.out.write(f"trial {trial.number} complete: {space.objective.metric} {score:.4g}\n")
        return score

    def _reporter(self, trial: Trial) -> Callable[[list[EvalPoint]], bool]:
        def report(points: list[EvalPoint]) -> bool:
            value = running_value(self.setup.space.objective, points, self.setup.target)
            with INTERRUPTS.writing():  # a signal now would leave the database locked (tune/interrupts.py)
                trial.report(value, step=len(points))
                prune = trial.should_prune()
            self.out.write(
                f"trial {trial.number} evaluation {len(points)}: return {points[-1].mean:.4g}, "
                f"{self.setup.space.objective.metric} so far {value:.4g}\n"
            )
            self.out.flush()
            return prune

        return report


def suggest(trial: Trial, param: Param) -> Any:
    """The trial's value for ``param`` (choices Optuna cannot store come back decoded)."""
    if param.kind == "float":
        return trial.suggest_float(param.key, param.low, param.high, log=param.log, step=param.step)
    if param.kind == "int":
        step = int(param.step or 1)
        return trial.suggest_int(param.key, int(param.low), int(param.high), log=param.log, step=step)
    if param.plain_choices:
        return trial.suggest_categorical(param.key, list(param.choices))
    texts = [_json(c) for c in param.choices]
    return param.choices[texts.index(trial.suggest_categorical(param.key, texts))]


def decoded(space: Space, params: dict[str, Any]) -> dict[str, Any]:
    """A trial's stored parameters as config values (JSON-stored choices read back)."""
    by_key = {p.key: p for p in space.params}
    out = {}
    for key, value in params.items():
        param = by_key.get(key)
        if param is not None and param.kind == "choices" and not param.plain_choices:
            value = param.choices[[_json(c) for c in param.choices].index(value)]
        out[key] = value
    return out


def _encoded(space: Space, values: dict[str, Any]) -> dict[str, Any]:
    by_key = {p.key: p for p in space.params}
    return {
        k: (_json(v) if by_key[k].kind == "choices" and not by_key[k].plain_choices else v)
        for k, v in values.items()
    }


def _json(value: Any) -> str:
    import json

    return json.dumps(value)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _start_time(pid: int) -> str | None:
    """The pid's start time in clock ticks since boot (/proc/PID/stat field 22): with the pid, it
    names one process even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: object, started: object) -> bool:
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return started is None or _start_time(pid) == started
