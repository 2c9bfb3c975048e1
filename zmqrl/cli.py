"""Command line: ``zmqrl launch | learner | actor | evaluator | eval | keys | config``.

Every command takes a YAML config and any number of ``--set section.key=value`` overrides. Process
mains stay thin: parse config, build the role, run it, clean up, report.
"""

from __future__ import annotations

import time

# Before the heavier imports: "N s after launch" in the summary counts from here.
COMMAND_STARTED = time.time()

import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

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
    from zmqrl.envs import EnvError
    from zmqrl.memory import ReplayMemoryError
    from zmqrl.transport.security import SecurityError
    from zmqrl.transport.sockets import BindError

    try:
        role = make()
    except (EnvError, ValueError) as exc:
        _fail(str(exc), EXIT_CONFIG)
    _on_stop_signals(role.request_stop)
    try:
        return dict(role.run())
    except (BindError, SecurityError) as exc:
        _fail(str(exc), EXIT_RUNTIME)
    except EnvError as exc:
        _fail(str(exc), EXIT_CONFIG)
    except ReplayMemoryError as exc:
        _fail(str(exc), EXIT_CONFIG)


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
    from zmqrl.roles.supervisor import Supervisor, previous_run_state
    from zmqrl.transport.security import SecurityError
    from zmqrl.transport.sockets import BindError

    resuming = resume is not None
    if not resuming and previous_run_state(cfg.run_dir) == "stopped":
        typer.echo(
            f"{cfg.run_dir} holds a stopped run: continuing it from its latest checkpoint "
            f"(use --name to start a separate run)"
        )
        resuming = True
    try:
        code = Supervisor(cfg, launched=COMMAND_STARTED, resume=resuming).run()
    except (BindError, SecurityError) as exc:
        _fail(str(exc), EXIT_RUNTIME)
    raise typer.Exit(code)


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
    from zmqrl.roles.learner import Learner
    from zmqrl.roles.link import SUPERVISED_ENV

    if not os.environ.get(SUPERVISED_ENV):
        save_config(cfg, cfg.run_dir / "config.yaml")
    stats = _run_role(lambda: Learner(cfg, resume=resume))
    stats.pop("eval_history", None)
    typer.echo(json.dumps({"learner": stats}, default=float))
    if stats.get("state") == "failed":
        raise typer.Exit(EXIT_RUNTIME)


@app.command()
def actor(
    config: ConfigArg,
    id: Annotated[
        int,
        typer.Option(
            "--id",
            "-i",
            help="Actor index: picks its seed and its epsilon on the Ape-X ladder (0 explores most).",
        ),
    ] = 0,
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
    if id < 0:
        _fail("--id must be >= 0", EXIT_CONFIG)
    from zmqrl.roles.actor import Actor

    stats = _run_role(lambda: Actor(cfg, id, replacement=replacement))
    typer.echo(json.dumps({"actor": id, **stats}, default=float))


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
    from zmqrl.roles.evaluator import Evaluator

    stats = _run_role(lambda: Evaluator(cfg, resume=resume))
    stats.pop("eval_history", None)
    typer.echo(json.dumps({"evaluator": stats}, default=float))


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
            "default: a server pair plus one client pair named 'client'.",
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
