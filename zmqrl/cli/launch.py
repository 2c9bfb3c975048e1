"""The training commands: ``zmqrl launch`` (supervised processes, or ``--serial`` in one thread) and
``zmqrl supervise`` (watch processes an orchestrator starts).

zmqrl/cli/app.py adds them to the app (:func:`register`).
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from zmqrl.cli import COMMAND_STARTED
from zmqrl.cli.options import (
    EXIT_CONFIG,
    EXIT_RUNTIME,
    ConfigArg,
    InsecureOpt,
    LogLevelOpt,
    SetOpt,
    fail,
    load,
    require_writable,
)
from zmqrl.cli.process import SIGNAL_EXIT_BASE, run_role, setup_logging

if TYPE_CHECKING:
    from zmqrl.config import Config, LearnerConfig

DashboardOpt = Annotated[
    bool | None,
    typer.Option(
        "--dashboard/--plain",
        help="Show a live dashboard (the default on a terminal), or print plain progress lines every "
        "supervisor.progress_seconds (the default when stdout is not a terminal: CI, docker logs, a pipe).",
        show_default=False,
    ),
]


def register(app: typer.Typer) -> None:
    """Adds ``launch`` and then ``supervise`` to ``app``, each with the example its help ends with."""
    app.command(epilog="Example: zmqrl launch configs/cartpole_dqn.yaml --set run.seed=1")(launch)
    app.command(epilog="Example: zmqrl supervise configs/cartpole_dqn.yaml --set run.name=cartpole")(
        supervise
    )


def launch(
    config: Annotated[
        Path | None,
        typer.Argument(help="YAML config file (see configs/ and docs/configuration.md); omit with --resume."),
    ] = None,
    resume: Annotated[
        Path | None,
        typer.Option(
            "--resume",
            metavar="RUN_DIR",
            help="Continue the run in RUN_DIR from its checkpoints, "
            "with the config saved there (--set still applies).",
        ),
    ] = None,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="When resuming: continue even if the env, network, n_step or gamma differ from the "
            "checkpoint's (otherwise the learner refuses; sets checkpoint.force_resume).",
        ),
    ] = False,
    actors: Annotated[
        int | None,
        typer.Option("--actors", "-n", help="Number of actor processes (overrides actor.num_actors)."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Run name: results go to runs/NAME/.")] = None,
    serial: Annotated[
        bool,
        typer.Option(
            "--serial",
            help="Run the same components in this one process and thread, interleaved "
            "deterministically (no sockets, no child processes): for pdb, py-spy and profilers. "
            "The learner's progress goes to stderr; the learner evaluates (no separate evaluator).",
        ),
    ] = False,
    dashboard: DashboardOpt = None,
    insecure: InsecureOpt = False,
    log_level: LogLevelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Train: start the learner, N actors and (if evaluator.enabled) the evaluator as separate
    processes and supervise them.

    On a terminal a live dashboard shows every process and the run's progress (elsewhere a progress
    line is printed every few seconds); the learner's, the evaluator's and each actor's stats are
    printed at the end. `zmqrl status RUN_DIR` shows the same table from another shell. Ctrl-C stops
    every process cleanly (twice: kills them). Logs: runs/NAME/logs/.

    With --serial the same run happens in this one process instead, deterministically: Ctrl-C stops
    it after its final checkpoint (exit 130).

    A process that crashes, hangs or is killed is restarted; one that keeps failing without a
    healthy run (supervisor.healthy_seconds of useful work) is given up. Exit codes: 0 the run
    finished; 1 it failed (the learner, or every actor, given up: one line says which, how often
    and the last error of its log); 2 a setting or state only you can fix (the line says what);
    130 / 143 stopped by Ctrl-C / SIGTERM. See docs/fault-tolerance.md.
    """
    overrides = list(set_ or [])
    if actors is not None:
        overrides.append(f"actor.num_actors={actors}")
    if resume is not None:
        if config is not None:
            fail("give either CONFIG or --resume RUN_DIR, not both", EXIT_CONFIG)
        config = resume / "config.yaml"
        if not config.is_file():
            fail(f"{resume}: not a run directory (no config.yaml in it); give a runs/NAME", EXIT_CONFIG)
        overrides += [f"run.dir={resume.parent}", f"run.name={resume.name}"]
    elif config is None:
        fail("missing CONFIG (or --resume RUN_DIR); try: zmqrl launch configs/cartpole_dqn.yaml", EXIT_CONFIG)
    if name is not None:
        overrides.append(f"run.name={name}")
    if insecure:
        overrides.append("transport.insecure=true")
    if force:
        overrides.append("checkpoint.force_resume=true")
    elif resume is not None:  # a force saved in RUN_DIR/config.yaml by a forced resume does not carry over
        overrides.insert(0, "checkpoint.force_resume=false")
    cfg = load(config, overrides, log_level)
    if resume is not None:  # port 0 asked at the first start is asked again, not the port it got then
        cfg = _asked_endpoints_again(cfg, resume)
    setup_logging(cfg.run.log_level, "serial" if serial else "supervisor")
    require_writable(cfg.run_dir)  # either mode: before anything is written
    if not serial:  # --serial builds all of it at once, and says the same in one line
        _preflight(cfg)
    cfg, resuming = _place_run(cfg, resume is not None, serial)
    if serial:
        raise typer.Exit(_launch_serial(cfg, resuming))

    from zmqrl.supervisor.launch import Supervisor
    from zmqrl.transport.keys import SecurityError
    from zmqrl.transport.sockets import BindError

    try:
        code = Supervisor(cfg, launched=COMMAND_STARTED, resume=resuming, dashboard=dashboard).run()
    except (BindError, SecurityError) as exc:
        fail(str(exc), EXIT_RUNTIME)
    raise typer.Exit(code)


def _preflight(cfg: Config) -> None:
    """The settings people get wrong first (zmqrl/supervisor/preflight.py), checked before any
    process starts: one line and exit 2 (a setting) or 1 (a port someone holds) instead of a
    learner's failure shown in its log's last lines."""
    from zmqrl.supervisor.preflight import preflight_problem

    if problem := preflight_problem(cfg):
        fail(problem.message, EXIT_CONFIG if problem.setting else EXIT_RUNTIME)


def _asked_endpoints_again(cfg: Config, run_dir: Path) -> Config:
    """The config a resumed run starts with: RUN_DIR/config.yaml holds the ports its first start
    was given for the endpoints that asked for port 0 (its actors read them there); those may be
    anyone's by now, so each one still holding them asks for port 0 again (see
    zmqrl/supervisor/asked_endpoints.py)."""
    from zmqrl.supervisor.asked_endpoints import asked_again

    return replace(cfg, transport=asked_again(run_dir, cfg.transport))


def _place_run(cfg: Config, resume: bool, serial: bool) -> tuple[Config, bool]:
    """The run directory this launch writes to, and whether it continues the run there: a stopped
    run is continued, and a new run never mixes into a finished or failed one's TensorBoard events
    and checkpoints (it goes to NAME-2); says so when it decides either."""
    from zmqrl.supervisor.rundirs import choose_run_dir

    choice = choose_run_dir(cfg.run_dir, resume=resume, continue_stopped=True)
    again = "zmqrl launch --serial" if serial else "zmqrl launch"
    if choice.continued:
        typer.echo(
            f"{cfg.run_dir} holds a stopped run: continuing it from its latest checkpoint "
            f"(use --name to start a separate run)"
        )
    elif choice.moved:
        typer.echo(
            f"{cfg.run_dir} holds a {choice.previous or 'previous'} run: this run goes to {choice.run_dir} "
            f"(to continue that one: {again} --resume {cfg.run_dir})"
        )
        cfg = replace(cfg, run=replace(cfg.run, name=choice.run_dir.name))
    return cfg, choice.resume


def _launch_serial(cfg: Config, resume: bool) -> int:
    """``launch --serial``: the whole run in this thread (zmqrl/serial.py), then a short summary.
    Exit 0 when it ended by itself, 130/143 when Ctrl-C / SIGTERM stopped it (after its final
    checkpoint), 2 for settings that cannot work; a bug propagates with its traceback (exit 1)."""
    from zmqrl import strictjson
    from zmqrl.serial import SerialRun

    received: list[int] = []
    started = time.monotonic()
    stats = run_role(lambda: SerialRun(cfg, resume=resume), received)
    # The same files a launched run leaves: learner-stats.json (the Trainer's) and stats.json.
    (cfg.run_dir / "stats.json").write_text(strictjson.dumps(stats, indent=2))
    for line in serial_summary(stats, cfg.run_dir, time.monotonic() - started, cfg.learner):
        typer.echo(line)
    return SIGNAL_EXIT_BASE + received[0] if received else 0


def serial_summary(
    stats: dict[str, Any], run_dir: Path, seconds: float, learner_cfg: LearnerConfig | None = None
) -> list[str]:
    """A serial run's end: counters, the final evaluation, whether it stopped at its target
    (``learner_cfg``: the run's learner settings, for the target), where its files are (and, if it
    was stopped, how to continue it), and last the checkpoint to deploy."""
    from zmqrl.checkpoints.choice import deploy_line, stopped_at_target_line
    from zmqrl.learner.stopping import ended_words
    from zmqrl.transport.control import TARGET_HELD

    learner = stats["learner"]
    actors = stats["actors"]
    state = learner.get("state", "?")
    episodes = sum(int(a.get("episodes", 0)) for a in actors)
    history = learner.get("eval_history") or []
    if history:
        last = history[-1]
        best = max(float(e["mean"]) for e in history)
        evaluation = (
            f"final eval: {float(last['mean']):.2f} ± {float(last['std']):.2f} at {int(last['updates'])} "
            f"updates (best {best:.2f}, {len(history)} evaluations)"
        )
    else:
        evaluation = "final eval: none (no evaluation ran: see learner.eval_interval)"
    lines = [
        f"serial run {ended_words(state, learner.get('ended'))} in {seconds:.1f} s: "
        f"{int(learner.get('updates', 0))} updates, "
        f"{int(learner.get('samples', 0))} samples, {len(actors)} actor(s), {episodes} episodes",
        evaluation,
    ]
    held = learner.get("target_held")
    target = learner_cfg.target_return if learner_cfg is not None else None
    if (
        learner.get("ended") == TARGET_HELD
        and learner_cfg is not None
        and target is not None
        and isinstance(held, dict)
    ):
        lines.append(stopped_at_target_line(target, learner_cfg.target_hold, held))
    lines.append(f"run dir: {run_dir}")
    if state == "stopped":
        lines.append(f"continue it with: zmqrl launch --serial --resume {run_dir}")
    if isinstance(stats.get("deploy"), dict):
        lines.append(deploy_line(stats["deploy"]))
    return lines


def _trackers_installed(cfg: Config) -> None:
    """A tracker `logging.backends` names whose package is missing: one line with the pip command,
    before the supervisor opens its own logger (which would raise it from inside the run)."""
    from zmqrl.metrics.trackers import missing_tracker

    if problem := missing_tracker(cfg.logging.backends):
        fail(problem, EXIT_CONFIG)


def supervise(
    config: ConfigArg,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Watch the run in run.dir/run.name even though it finished (its roles continue it, e.g. "
            "after raising learner.max_updates); its stats.json is then replaced by this run's summary.",
        ),
    ] = False,
    dashboard: DashboardOpt = None,
    insecure: InsecureOpt = False,
    log_level: LogLevelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Watch a run whose processes something else starts (docker compose, Kubernetes, by hand).

    Binds transport.heartbeat and transport.control; the learner, actors and evaluator connect to
    them (give them ZMQRL_SUPERVISED=1 to have them wait for it and leave when it is gone). It
    shows the same dashboard (or progress lines) and summary as `launch`, reports processes that
    fall silent or hang (it cannot restart them: their orchestrator does), counts and reports every
    restart of a role (a new process start in its slot, however short the gap), and broadcasts stop
    when the learner finishes or on Ctrl-C / SIGTERM.

    A run directory whose run finished is not watched again (its summary would be overwritten by a
    run that ends at once): it exits 2 saying so; give a new run.name, or --resume to continue it.

    Exit 0 when the learner finished or SIGTERM stopped it (docker compose stop, a pod's end), 1 on
    an error, 2 for a setting or state to fix, 130 on Ctrl-C. The roles' own exit codes (0 finished
    or stopped on request, 1 failed, 2 needs you, 3 hung, 128 + N ended by signal N) tell their
    orchestrator what to restart: see docs/fault-tolerance.md.
    """
    overrides = [*(set_ or []), *(["transport.insecure=true"] if insecure else [])]
    cfg = load(config, overrides, log_level)
    setup_logging(cfg.run.log_level, "supervisor")
    from zmqrl.supervisor.rundirs import finished_run

    require_writable(cfg.run_dir)
    finished = None if resume else finished_run(cfg.run_dir)
    if finished is not None:
        fail(
            f"the run in {cfg.run_dir} {finished} (summary: {cfg.run_dir / 'stats.json'}); not watching it "
            "again, which would overwrite that summary: give the new run a name of its own (run.name, e.g. "
            "--set run.name=NAME or ZMQRL_RUN__NAME=NAME for every role), or continue this one with "
            "`zmqrl supervise --resume` after raising learner.max_updates",
            EXIT_CONFIG,
        )
    _trackers_installed(cfg)
    from zmqrl.supervisor.watch import Watcher
    from zmqrl.transport.keys import SecurityError
    from zmqrl.transport.sockets import BindError

    try:
        code = Watcher(cfg, launched=COMMAND_STARTED, dashboard=dashboard).run()
    except (BindError, SecurityError) as exc:
        fail(" ".join(str(exc).split()), EXIT_RUNTIME)
    raise typer.Exit(code)
