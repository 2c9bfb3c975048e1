"""``zmqrl tune``: an Optuna study whose trials are real runs (zmqrl/tune/, docs/tuning.md).

zmqrl/cli/app.py adds it to the app (:func:`register`). Optuna (the ``tune`` extra) is imported
only when the command runs, so the rest of the CLI never needs it.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Annotated

import typer

from zmqrl.cli.options import EXIT_CONFIG, EXIT_RUNTIME, ConfigArg, SetOpt, fail, load, require_writable
from zmqrl.cli.process import SIGNAL_EXIT_BASE
from zmqrl.errors import ConfigError
from zmqrl.tune import INSTALL_HINT, POSTGRES_HINT
from zmqrl.tune.interrupts import INTERRUPTS


def register(app: typer.Typer) -> None:
    """Adds ``tune`` to ``app``, with the example its help ends with."""
    app.command(
        short_help="Tune hyperparameters with Optuna: each trial a real run, hopeless ones pruned.",
        epilog="Example: zmqrl tune configs/cartpole_dqn.yaml --space configs/tune/cartpole_dqn.yaml",
    )(tune)


def tune(
    config: ConfigArg,
    space: Annotated[
        Path,
        typer.Option("--space", help="Search space YAML: tuned keys, objective, pruner (docs/tuning.md)."),
    ],
    trials: Annotated[
        int, typer.Option("--trials", min=1, help="Trials to end (complete or pruned) in the whole study.")
    ] = 20,
    directory: Annotated[
        Path | None,
        typer.Option(
            "--dir",
            help="Tune directory: study.db, trials/, results.md, best.yaml (default: runs/tune/STUDY).",
        ),
    ] = None,
    study_name: Annotated[
        str | None, typer.Option("--study", help="Study name (default: the space file's name without .yaml).")
    ] = None,
    storage: Annotated[
        str | None,
        typer.Option(
            "--storage",
            metavar="URL",
            help="Optuna storage URL shared by tuners on several hosts, e.g. "
            "postgresql://user:pass@db-host/zmqrl (default: sqlite:///DIR/study.db).",
        ),
    ] = None,
    serial: Annotated[
        bool, typer.Option("--serial", help="Run each trial as `zmqrl launch --serial`.")
    ] = False,
    overrides: SetOpt = None,
) -> None:
    """Search hyperparameters with Optuna: each trial is a `zmqrl launch` of the config with values
    drawn from the search space, in a run directory of its own under the tune directory.

    Evaluations are reported while a trial runs, so the space's pruner (median or Hyperband) stops
    hopeless trials early with SIGTERM, as a user would. The study lives in SQLite in the tune
    directory unless --storage names a database; run the same command again to resume it after
    Ctrl-C or a crash: the interrupted trial's parameters are tried again and no trial counts twice.

    At the end (and on Ctrl-C) the best trials and the parameters' importances are printed and
    written to results.md, and the best trial's config to best.yaml, ready for `zmqrl launch`.
    """
    try:
        import optuna
    except ImportError:
        fail(INSTALL_HINT, EXIT_RUNTIME)  # as plot, export and video: a missing extra exits 1
    from zmqrl.tune.report import BEST_FILE, RESULTS_FILE, summary, write_best
    from zmqrl.tune.space import check_keys, load_space
    from zmqrl.tune.study import (
        Setup,
        TrialFailed,
        ended,
        open_study,
        recover_abandoned,
        run_trials,
        shown_url,
        storage_url,
    )

    cfg = load(config, overrides)
    try:
        parsed = load_space(space)
        check_keys(parsed, config, overrides or [])
    except ConfigError as exc:
        fail(" ".join(str(exc).split()), EXIT_CONFIG)
    target = parsed.objective.target if parsed.objective.target is not None else cfg.learner.target_return
    if parsed.objective.metric == "time_to_target" and target is None:
        fail(
            f"{space}: objective.target: time_to_target needs a target (or learner.target_return)",
            EXIT_CONFIG,
        )
    name = study_name or space.stem
    tune_dir = directory or Path("runs") / "tune" / name
    require_writable(tune_dir, "--dir")
    tune_dir.mkdir(parents=True, exist_ok=True)
    setup = Setup(parsed, config.resolve(), list(overrides or []), tune_dir, serial, target)
    url = storage_url(tune_dir, storage)
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own progress lines say it once
    shown = shown_url(url)
    try:
        study = open_study(setup, name, url)
    except ImportError as exc:  # the database's driver (Optuna re-raises SQLAlchemy's import error)
        missing = getattr(exc.__cause__, "name", None) or exc.name
        fail(f"{shown}: its database driver ({missing}) is not installed; {POSTGRES_HINT}", EXIT_RUNTIME)
    except ValueError as exc:
        fail(str(exc).replace(url, shown), EXIT_CONFIG)
    out = sys.stdout
    recover_abandoned(study, out)
    typer.echo(
        f"study {name} in {url}: {ended(study)} of {trials} trials ended; runs in {tune_dir / 'trials'}"
    )
    # SIGTERM ends the tuner as Ctrl-C does: the running trial is stopped and saved, not orphaned.
    # Both wait while the study is written (zmqrl/tune/interrupts.py says why).
    for handled in (signal.SIGINT, signal.SIGTERM):
        signal.signal(handled, lambda signum, frame: INTERRUPTS.signal(signum))
    code = 0
    try:
        run_trials(study, setup, trials, out)
    except KeyboardInterrupt as exc:
        signum = exc.args[0] if exc.args and isinstance(exc.args[0], int) else signal.SIGINT
        typer.echo(f"interrupted: the same command resumes study {name}", err=True)
        code = SIGNAL_EXIT_BASE + int(signum)
    except TrialFailed as exc:  # too many failures in a row
        typer.echo(f"error: {exc}", err=True)
        code = EXIT_RUNTIME
    except FileExistsError as exc:  # a trial's run directory, left by another study in this --dir
        fail(str(exc), EXIT_CONFIG)
    table = summary(study, parsed)
    (tune_dir / RESULTS_FILE).write_text(table)
    typer.echo(table, nl=False)
    best = write_best(study, parsed, config, tune_dir / BEST_FILE)
    if best is not None:
        typer.echo(f"best: trial {best.number}; its config: zmqrl launch {tune_dir / BEST_FILE}")
    raise typer.Exit(code)

