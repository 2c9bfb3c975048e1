"""Command line: ``zmqrl launch | supervise | learner | actor | evaluator | health | eval | keys | config``.

Every command takes a YAML config and any number of ``--set section.key=value`` overrides. Process
mains stay thin: parse config, build the role, run it, clean up, report.
"""

from __future__ import annotations

import time

# Before the heavier imports: "N s after launch" in the summary counts from here.
COMMAND_STARTED = time.time()

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from zmqrl import strictjson

# Exit codes (documented in README): 0 ok, 1 runtime failure, 2 bad config or usage.
EXIT_RUNTIME, EXIT_CONFIG = 1, 2

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,  # plain tracebacks: short, and never dumping local variables
    help="zmqrl: asynchronous reinforcement learning over ZeroMQ. Many CPU actors sample, one learner "
    "trains from replay and publishes weights, a supervisor keeps them running. Start with "
    "`zmqrl launch configs/cartpole_dqn.yaml`. Every command takes a YAML config and repeatable "
    "`--set section.key=value` overrides; `zmqrl config FILE` prints the resolved config.",
)

ConfigArg = Annotated[
    Path, typer.Argument(help="YAML config file (see configs/ and README 'Configuration').")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="SECTION.KEY=VALUE",
        help="Override one config value, e.g. --set learner.max_updates=5000 (repeatable).",
    ),
]


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def _load(config: Path, overrides: list[str] | None) -> Any:
    from zmqrl.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as exc:
        _fail(str(exc), EXIT_CONFIG)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _on_stop_signals(request_stop: Callable[[], None]) -> None:
    """First SIGINT/SIGTERM asks the role to stop cleanly; a second SIGINT interrupts at once."""

    def handler(signum: int, _frame: Any) -> None:
        if signum == signal.SIGINT and getattr(handler, "seen", False):
            raise KeyboardInterrupt
        handler.seen = True  # type: ignore[attr-defined]
        logging.getLogger("zmqrl").info("%s: stopping cleanly", signal.Signals(signum).name)
        request_stop()

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)


InsecureOpt = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="Allow binding a non-loopback address without Curve keys (prints a "
        "warning): only on a trusted network. See README 'Security'.",
    ),
]


def _run_role(make: Callable[[], Any]) -> dict[str, Any]:
    """Build and run a role. Settings that cannot work (the ConfigError family, whether found while
    building or deep inside ``run()``) exit 2 with one line; a port in use or unusable keys exit 1
    with one line, as does an actor that could not reach its learner; anything else is a bug and
    propagates: a traceback in the log, exit 1."""
    from zmqrl.envs import EnvError
    from zmqrl.errors import ConfigError
    from zmqrl.memory import ReplayMemoryError
    from zmqrl.transport.channels import LearnerUnreachable
    from zmqrl.transport.security import SecurityError
    from zmqrl.transport.sockets import BindError

    try:
        role = make()
        _on_stop_signals(role.request_stop)
        return dict(role.run())
    except (ConfigError, EnvError, ReplayMemoryError) as exc:
        _fail(" ".join(str(exc).split()), EXIT_CONFIG)
    except (BindError, SecurityError, LearnerUnreachable) as exc:
        _fail(" ".join(str(exc).split()), EXIT_RUNTIME)


def _start_link(cfg: Any, role: str, role_id: int) -> Any:
    """First thing in a role's process, before torch is imported: its heartbeat thread (so the
    supervisor hears it within a second of its start), the guard that turns any thread's death
    into the process's, and the parent-death signal when a supervisor started it."""
    from zmqrl.guard import install_process_guard
    from zmqrl.roles.link import SupervisorLink, die_with_parent
    from zmqrl.transport.security import SecurityError

    install_process_guard()
    die_with_parent()
    import zmq

    try:
        return SupervisorLink(zmq.Context.instance(), cfg, role, role_id)
    except SecurityError as exc:
        _fail(" ".join(str(exc).split()), EXIT_RUNTIME)


@app.command()
def launch(
    config: Annotated[
        Path | None,
        typer.Argument(
            help="YAML config file (see configs/ and README 'Configuration'); omit with --resume."
        ),
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
    actors: Annotated[
        int | None,
        typer.Option("--actors", "-n", help="Number of actor processes (overrides actor.num_actors)."),
    ] = None,
    name: Annotated[str | None, typer.Option("--name", help="Run name: results go to runs/NAME/.")] = None,
    insecure: InsecureOpt = False,
    set_: SetOpt = None,
) -> None:
    """Train: start the learner, N actors and (if evaluator.enabled) the evaluator as separate
    processes and supervise them.

    Progress is printed every few seconds; the learner's, the evaluator's and each actor's stats are
    printed at the end. Ctrl-C stops every process cleanly (twice: kills them). Logs: runs/NAME/logs/.
    """
    overrides = list(set_ or [])
    if actors is not None:
        overrides.append(f"actor.num_actors={actors}")
    if resume is not None:
        if config is not None:
            _fail("give either CONFIG or --resume RUN_DIR, not both", EXIT_CONFIG)
        config = resume / "config.yaml"
        overrides += [f"run.dir={resume.parent}", f"run.name={resume.name}"]
    elif config is None:
        _fail(
            "missing CONFIG (or --resume RUN_DIR); try: zmqrl launch configs/cartpole_dqn.yaml", EXIT_CONFIG
        )
    if name is not None:
        overrides.append(f"run.name={name}")
    if insecure:
        overrides.append("transport.insecure=true")
    cfg = _load(config, overrides)
    _setup_logging(cfg.run.log_level)
    from dataclasses import replace

    from zmqrl.roles.supervisor import Supervisor, holds_results, next_free_run_dir, previous_run_state
    from zmqrl.transport.security import SecurityError
    from zmqrl.transport.sockets import BindError

    resuming = resume is not None
    previous = None if resuming else previous_run_state(cfg.run_dir)
    if previous == "stopped":
        typer.echo(
            f"{cfg.run_dir} holds a stopped run: continuing it from its latest checkpoint "
            f"(use --name to start a separate run)"
        )
        resuming = True
    elif not resuming and holds_results(cfg.run_dir):
        # Never mix a new run's TensorBoard events and checkpoints into a finished or failed one.
        fresh = next_free_run_dir(cfg.run_dir)
        typer.echo(
            f"{cfg.run_dir} holds a {previous or 'previous'} run: this run goes to {fresh} "
            f"(to continue that one: zmqrl launch --resume {cfg.run_dir})"
        )
        cfg = replace(cfg, run=replace(cfg.run, name=fresh.name))
    try:
        code = Supervisor(cfg, launched=COMMAND_STARTED, resume=resuming).run()
    except (BindError, SecurityError) as exc:
        _fail(str(exc), EXIT_RUNTIME)
    raise typer.Exit(code)


@app.command()
def supervise(
    config: ConfigArg,
    insecure: InsecureOpt = False,
    set_: SetOpt = None,
) -> None:
    """Watch a run whose processes something else starts (docker compose, Kubernetes, by hand).

    Binds transport.heartbeat and transport.control; the learner, actors and evaluator connect to
    them (give them ZMQRL_SUPERVISED=1 to have them wait for it and leave when it is gone). It
    prints the same progress lines and summary as `launch`, reports processes that fall silent or
    hang (it cannot restart them: their orchestrator does), and broadcasts stop when the learner
    finishes or on Ctrl-C / SIGTERM. Exit 0 when the learner finished, 130/143 on a signal.
    """
    overrides = [*(set_ or []), *(["transport.insecure=true"] if insecure else [])]
    cfg = _load(config, overrides)
    _setup_logging(cfg.run.log_level)
    from zmqrl.roles.watcher import Watcher
    from zmqrl.transport.security import SecurityError
    from zmqrl.transport.sockets import BindError

    try:
        code = Watcher(cfg, launched=COMMAND_STARTED).run()
    except (BindError, SecurityError) as exc:
        _fail(" ".join(str(exc).split()), EXIT_RUNTIME)
    raise typer.Exit(code)


@app.command()
def health(
    file: Annotated[
        Path | None,
        typer.Option(
            "--file",
            "-f",
            help="The role's health file (default: $ZMQRL_HEALTH_FILE, rewritten on every heartbeat).",
        ),
    ] = None,
) -> None:
    """Exit 0 if the role in this container is alive and making progress, else 1 and one line why.

    For container health checks and Kubernetes probes: the role must run with ZMQRL_HEALTH_FILE
    set. Judged like the supervisor judges heartbeats: no beat for supervisor.heartbeat_timeout
    is dead, no progress for supervisor.progress_timeout is hung."""
    from zmqrl.health import HEALTH_FILE_ENV, health_path, judge, read_health

    path = file or health_path()
    if path is None:
        _fail(f"no health file: set {HEALTH_FILE_ENV} for the role (and here), or pass --file", EXIT_RUNTIME)
    try:
        record = read_health(path)
    except ValueError as exc:
        typer.echo(f"unhealthy: {exc}")
        raise typer.Exit(EXIT_RUNTIME) from None
    ok, reason = judge(record)
    typer.echo(reason if ok else f"unhealthy: {reason}")
    raise typer.Exit(0 if ok else EXIT_RUNTIME)


@app.command()
def learner(
    config: ConfigArg,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="Continue from the newest readable checkpoint "
            "in the run directory (network, optimizer, counters, replay).",
        ),
    ] = False,
    insecure: InsecureOpt = False,
    set_: SetOpt = None,
) -> None:
    """Run the learner alone (actors connect to it). Binds transport.samples and transport.weights."""
    cfg = _load(config, [*(set_ or []), *(["transport.insecure=true"] if insecure else [])])
    _setup_logging(cfg.run.log_level)
    from zmqrl.config import save_config
    from zmqrl.roles.link import SUPERVISED_ENV

    if not os.environ.get(SUPERVISED_ENV):
        save_config(cfg, cfg.run_dir / "config.yaml")
    link = _start_link(cfg, "learner", 0)
    from zmqrl.roles.learner import Learner

    stats = _run_role(lambda: Learner(cfg, resume=resume, link=link))
    stats.pop("eval_history", None)
    typer.echo(strictjson.dumps({"learner": stats}))
    if stats.get("state") == "failed":
        raise typer.Exit(EXIT_RUNTIME)


@app.command()
def actor(
    config: ConfigArg,
    id: Annotated[
        str | None,
        typer.Option(
            "--id",
            "-i",
            metavar="N|auto",
            help="Actor index: picks its seed and its epsilon on the Ape-X ladder (0 explores most). "
            "An integer here wins; else the ZMQRL_ACTOR_ID environment variable (an integer or "
            "'auto'); 'auto' claims the lowest id no live actor of this run directory holds (for "
            "scaled container replicas sharing the run directory); with neither, 0.",
        ),
    ] = None,
    replacement: Annotated[
        bool,
        typer.Option(
            "--replacement",
            help="Started in place of a failed actor (launch does this): wait "
            "for the learner's current weights before acting, and skip the epsilon warm-up.",
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Run one actor: steps its env, pushes samples to transport.samples, follows transport.weights."""
    cfg = _load(config, set_)
    _setup_logging(cfg.run.log_level)
    from zmqrl.actor_ids import ActorIdError, resolve_actor_id

    try:  # the claim's lock reserves the id until this process exits
        claim = resolve_actor_id(id, os.environ, cfg.run_dir, cfg.actor.num_actors)
    except ActorIdError as exc:
        _fail(str(exc), EXIT_CONFIG)
    actor_id = claim.actor_id
    logging.getLogger("zmqrl").info("%s", claim.describe())
    link = _start_link(cfg, "actor", actor_id)
    from zmqrl.roles.actor import Actor

    stats = _run_role(lambda: Actor(cfg, actor_id, replacement=replacement, link=link))
    typer.echo(strictjson.dumps({"actor": actor_id, **stats}))


@app.command()
def evaluator(
    config: ConfigArg,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Keep the score of the run's existing checkpoints/best as the one to beat."
        ),
    ] = False,
    set_: SetOpt = None,
) -> None:
    """Run the evaluator: follows transport.weights, plays evaluator.episodes greedy episodes of each
    new version (at most every evaluator.interval_seconds), logs to TensorBoard and keeps the best
    weights in checkpoints/best. `launch` starts it when evaluator.enabled is true."""
    cfg = _load(config, set_)
    _setup_logging(cfg.run.log_level)
    link = _start_link(cfg, "evaluator", 0)
    from zmqrl.roles.evaluator import Evaluator

    stats = _run_role(lambda: Evaluator(cfg, resume=resume, link=link))
    stats.pop("eval_history", None)
    typer.echo(strictjson.dumps({"evaluator": stats}))


@app.command("eval")
def eval_checkpoint(
    checkpoint: Annotated[Path, typer.Argument(help="A checkpoint file, e.g. runs/NAME/checkpoints/best.")],
    episodes: Annotated[int, typer.Option("--episodes", "-e", help="Greedy episodes to play.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Episode i resets with seed + i.")] = 0,
    video: Annotated[
        Path | None,
        typer.Option(
            "--video",
            help="Also record every episode as DIR/eval-episode-<i>.mp4 (needs the `video` extra: "
            'pip install -e ".[video]").',
            metavar="DIR",
        ),
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Play a saved policy greedily and print its mean ± std return (uses the config stored in the
    checkpoint; --set can change it, e.g. --set env.max_episode_steps=1000)."""
    from zmqrl.config import ConfigError
    from zmqrl.envs import EnvError
    from zmqrl.evaluation import evaluate_checkpoint

    if episodes < 1:
        _fail("--episodes must be >= 1", EXIT_CONFIG)
    if not checkpoint.is_file():
        _fail(f"{checkpoint}: no such checkpoint file", EXIT_CONFIG)
    try:
        result = evaluate_checkpoint(checkpoint, episodes, seed, list(set_ or []), video_dir=video)
    except (ConfigError, EnvError) as exc:
        _fail(str(exc), EXIT_CONFIG)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        _fail(str(exc), EXIT_RUNTIME)
    typer.echo(
        f"{checkpoint}: mean return {result.mean:.1f} ± {result.std:.1f} over {episodes} episodes "
        f"(min {min(result.returns):.1f}, max {max(result.returns):.1f}, mean length "
        f"{sum(result.lengths) / len(result.lengths):.0f})"
    )
    for path in result.videos:
        typer.echo(f"video: {path}")


@app.command()
def keys(
    keys_dir: Annotated[Path, typer.Argument(help="Directory for the keys (created if missing).")],
    client: Annotated[
        list[str] | None,
        typer.Option(
            "--client",
            "-c",
            help="Name of a client key pair to add and authorize (repeatable); "
            "default: a server pair plus one client pair named 'client'. A process uses the pair "
            "NAME with --set transport.key_name=NAME (or ZMQRL_TRANSPORT__KEY_NAME=NAME); revoke it "
            "by deleting KEYS_DIR/authorized/NAME.key.",
        ),
    ] = None,
) -> None:
    """Make CurveZMQ keys: a server pair (learner, supervisor), client pairs (every process that
    connects), and KEYS_DIR/authorized/ listing the clients the servers accept. Then run with
    --set transport.keys_dir=KEYS_DIR (README 'Security')."""
    from zmqrl.transport.security import SecurityError, create_keys

    try:
        written = create_keys(keys_dir, list(client) if client else None)
    except (SecurityError, FileExistsError, ValueError) as exc:
        _fail(str(exc), EXIT_RUNTIME)
    for path in written:
        typer.echo(str(path))


@app.command("config")
def show_config(config: ConfigArg, set_: SetOpt = None) -> None:
    """Print the resolved config (defaults + file + overrides) as YAML, and check it."""
    import yaml

    cfg = _load(config, set_)
    typer.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False), nl=False)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
