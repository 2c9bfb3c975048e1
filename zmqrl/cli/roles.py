"""The single-role and tool commands: ``zmqrl learner | actor | evaluator`` (one role in this process,
as ``launch`` starts them or an orchestrator does) and ``zmqrl health | eval | keys | config``.

zmqrl/cli/app.py adds them to the app (:func:`register`).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from zmqrl import strictjson
from zmqrl.cli.options import (
    EXIT_CONFIG,
    EXIT_RUNTIME,
    ConfigArg,
    InsecureOpt,
    LogLevelOpt,
    SetOpt,
    config_path_problem,
    fail,
    load,
)
from zmqrl.cli.process import Role, check_run_dir, role_exit_code, run_role, setup_logging, start_link
from zmqrl.transport.control_trust import with_role_key


def register(app: typer.Typer) -> None:
    """Adds the role commands, then the tools, to ``app``, each with the example its help ends with."""
    app.command(epilog="Example: zmqrl learner configs/cartpole_dqn.yaml --resume")(learner)
    app.command(epilog="Example: zmqrl actor configs/cartpole_dqn.yaml --id 3")(actor)
    app.command(epilog="Example: zmqrl evaluator configs/cartpole_dqn.yaml --set evaluator.episodes=20")(
        evaluator
    )
    app.command(epilog="Example: ZMQRL_HEALTH_FILE=/tmp/zmqrl-health.json zmqrl health")(health)
    app.command("eval", epilog="Example: zmqrl eval runs/cartpole_dqn/checkpoints/best --episodes 20")(
        eval_checkpoint
    )
    app.command(epilog="Example: zmqrl keys keys/ --client actor.host-a --token keys/control.token")(keys)
    app.command("config", epilog="Example: zmqrl config configs/cartpole_dqn.yaml --set agent.lr=0.0005")(
        show_config
    )


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
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="With --resume: resume even if the env, network, n_step or gamma differ from the "
            "checkpoint's (otherwise refused; sets checkpoint.force_resume).",
        ),
    ] = False,
    insecure: InsecureOpt = False,
    log_level: LogLevelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run the learner alone (actors connect to it). Binds transport.samples and transport.weights."""
    flags = ["transport.insecure=true"] if insecure else []
    flags += ["checkpoint.force_resume=true"] if force else []
    cfg = load(config, [*(set_ or []), *flags], log_level)
    setup_logging(cfg.run.log_level, "learner-0")
    check_run_dir(cfg, "learner")
    from zmqrl.config import save_config
    from zmqrl.runtime.link import SUPERVISED_ENV

    if not os.environ.get(SUPERVISED_ENV):
        save_config(cfg, cfg.run_dir / "config.yaml")
    cfg = with_role_key(cfg, "learner", 0)  # with keys: the client pair bound to this role
    link = start_link(cfg, "learner", 0)
    from zmqrl.runtime.testhooks import Faults

    received: list[int] = []
    faults = Faults.from_env()  # a test's injected faults (ZMQRL_TEST_HOOKS), read here only

    def make() -> Role:
        # The sockets before torch's import (about a second): actors connect while it loads.
        import zmq

        from zmqrl.learner.endpoints import bind_learner_sockets

        bound = bind_learner_sockets(cfg, zmq.Context.instance())
        try:
            from zmqrl.learner.main import Learner

            return Learner(cfg, resume=resume, link=link, faults=faults, bound=bound)
        except BaseException:
            bound.close()
            raise

    stats = run_role(make, received)
    stats.pop("eval_history", None)
    typer.echo(strictjson.dumps({"learner": stats}))
    raise typer.Exit(role_exit_code(stats, received, link))


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
    log_level: LogLevelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run one actor: steps its env, pushes samples to transport.samples, follows transport.weights."""
    cfg = load(config, set_, log_level)
    setup_logging(cfg.run.log_level, "actor")  # until its id is settled
    check_run_dir(cfg, "actor")  # before its id's lock file is written in the run directory
    from zmqrl.actor.ids import ActorIdError, resolve_actor_id

    try:  # the claim's lock reserves the id until this process exits
        claim = resolve_actor_id(id, os.environ, cfg.run_dir, cfg.actor.num_actors)
    except ActorIdError as exc:
        fail(str(exc), EXIT_CONFIG)
    actor_id = claim.actor_id
    setup_logging(cfg.run.log_level, f"actor-{actor_id}")
    logging.getLogger("zmqrl").info("%s", claim.describe())
    cfg = with_role_key(cfg, "actor", actor_id)  # with keys: the client pair bound to this role
    link = start_link(cfg, "actor", actor_id)
    from zmqrl.actor.main import Actor
    from zmqrl.runtime.testhooks import Faults

    received: list[int] = []
    faults = Faults.from_env()  # a test's injected faults (ZMQRL_TEST_HOOKS), read here only
    stats = run_role(
        lambda: Actor(cfg, actor_id, replacement=replacement, link=link, faults=faults), received
    )
    typer.echo(strictjson.dumps({"actor": actor_id, **stats}))
    raise typer.Exit(role_exit_code(stats, received, link))


def evaluator(
    config: ConfigArg,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume", help="Keep the score of the run's existing checkpoints/best as the one to beat."
        ),
    ] = False,
    log_level: LogLevelOpt = None,
    set_: SetOpt = None,
) -> None:
    """Run the evaluator: follows transport.weights, plays evaluator.episodes greedy episodes of each
    new version (at most every evaluator.interval_seconds), logs to TensorBoard and keeps the best
    weights in checkpoints/best. `launch` starts it when evaluator.enabled is true."""
    cfg = load(config, set_, log_level)
    setup_logging(cfg.run.log_level, "evaluator-0")
    check_run_dir(cfg, "evaluator")
    cfg = with_role_key(cfg, "evaluator", 0)  # with keys: the client pair bound to this role
    link = start_link(cfg, "evaluator", 0)
    from zmqrl.evaluator.main import Evaluator

    received: list[int] = []
    stats = run_role(lambda: Evaluator(cfg, resume=resume, link=link), received)
    stats.pop("eval_history", None)
    typer.echo(strictjson.dumps({"evaluator": stats}))
    raise typer.Exit(role_exit_code(stats, received, link))


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
    from zmqrl.cli.healthcheck import verdict

    # Reached only for arguments the probe's fast path leaves to typer (zmqrl/cli/app.py main):
    # the same verdict, so that both ways judge alike.
    code, line, error = verdict(file)
    typer.echo(line, err=error)
    raise typer.Exit(code)


def eval_checkpoint(
    checkpoint: Annotated[
        Path | None,
        typer.Argument(
            help="A checkpoint file, e.g. runs/NAME/checkpoints/best, or a run directory (its latest); "
            "or give --onnx FILE."
        ),
    ] = None,
    episodes: Annotated[int, typer.Option("--episodes", "-e", help="Greedy episodes to play.")] = 10,
    seed: Annotated[int, typer.Option("--seed", help="Episode i resets with seed + i.")] = 0,
    video: Annotated[
        Path | None,
        typer.Option(
            "--video",
            help="Also record every episode as DIR/eval-episode-<i>.mp4 (needs the `video` extra: "
            'pip install -e ".\\[video]").',
            metavar="DIR",
        ),
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            metavar="FILE",
            help="Play with this config (yours, e.g. the run's runs/NAME/config.yaml) instead of the "
            "one stored in the checkpoint.",
        ),
    ] = None,
    trust_config: Annotated[
        bool,
        typer.Option(
            "--trust-config",
            help="Let the checkpoint's stored config import the code it names (an env factory or "
            "agent plugin 'module:...' as env.id or agent.kind). Only for checkpoints you trust: "
            "without it such a config is refused before anything is imported.",
        ),
    ] = False,
    onnx: Annotated[
        Path | None,
        typer.Option(
            "--onnx",
            metavar="FILE",
            help="Play this exported policy (zmqrl export) instead of a checkpoint, with onnxruntime "
            "and without torch, in the env stored in it (--config and --set can change it).",
        ),
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Play a saved policy greedily and print its mean ± std return (uses the config stored in the
    checkpoint, or --config FILE; --set can change it, e.g. --set env.max_episode_steps=1000).

    A checkpoint is data: if its stored config names code to import (env.id or agent.kind as
    'module:...'), it is refused (exit 2) unless you give that value yourself (--set, --config) or
    pass --trust-config. Registered gymnasium ids, built-in and installed agents play as they are.

    With --onnx FILE instead of a checkpoint, a policy exported by `zmqrl export` is played with
    onnxruntime (the onnx extra), torch never imported; the same rules hold for the env stored in it."""
    from zmqrl.config import ConfigError
    from zmqrl.envs.factory import EnvError
    from zmqrl.evaluator.greedy import evaluate_checkpoint

    if episodes < 1:
        fail("--episodes must be >= 1", EXIT_CONFIG)
    if (checkpoint is None) == (onnx is None):
        fail("give a CHECKPOINT or --onnx FILE (one of them)", EXIT_CONFIG)
    if config is not None and (problem := config_path_problem(config)) is not None:
        fail(problem, EXIT_CONFIG)
    if onnx is not None:
        if video is not None:
            fail("--video records checkpoints only; play the checkpoint the model came from", EXIT_CONFIG)
        from zmqrl.cli.export import eval_onnx

        eval_onnx(onnx, episodes, seed, list(set_ or []), config, trust_config)
        return
    assert checkpoint is not None
    from zmqrl.checkpoints.policy import checkpoint_path

    try:  # a run directory plays its latest, as `zmqrl export` and zmqrl.load_policy take it
        checkpoint = checkpoint_path(checkpoint)
    except FileNotFoundError as exc:
        fail(str(exc), EXIT_CONFIG)
    try:
        result = evaluate_checkpoint(
            checkpoint,
            episodes,
            seed,
            list(set_ or []),
            video_dir=video,
            config=config,
            trust_config=trust_config,
        )
    except (ConfigError, EnvError) as exc:
        fail(" ".join(str(exc).split()), EXIT_CONFIG)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        fail(str(exc), EXIT_RUNTIME)
    from zmqrl.cli.export import played_line

    typer.echo(played_line(checkpoint, result.mean, result.std, result.returns, result.lengths))
    for path in result.videos:
        typer.echo(f"video: {path}")


def keys(
    keys_dir: Annotated[
        Path | None, typer.Argument(help="Directory for the keys (created if missing).")
    ] = None,
    client: Annotated[
        list[str] | None,
        typer.Option(
            "--client",
            "-c",
            help="Name of a client key pair to add and authorize (repeatable); default: a server pair, "
            "one pair per role (learner, actor, evaluator: the supervisor lets each speak only as its "
            "role) and one named 'client' (tools, `zmqrl status`). Roles pick the pair named for them; "
            "NAME is used with --set transport.key_name=NAME (per-host actor keys: actor.HOST). Revoke "
            "one by deleting KEYS_DIR/authorized/NAME.key.",
        ),
    ] = None,
    token: Annotated[
        Path | None,
        typer.Option(
            "--token",
            metavar="FILE",
            help="Write a fresh control token to FILE (mode 0600): the run's secret that authenticates "
            "heartbeats and control messages without keys. It is the supervisor's "
            "(transport.control_token_file=FILE); give roles their keys with --role-keys.",
        ),
    ] = None,
    role_keys: Annotated[
        Path | None,
        typer.Option(
            "--role-keys",
            metavar="DIR",
            help="With --token FILE (new or existing): write each role's control key, derived from the "
            "token, to DIR/ROLE/control.key (learner, actor, evaluator). Copy each role only its own "
            "and run it with transport.control_keys_dir=DIR: no role can then speak as another.",
        ),
    ] = None,
) -> None:
    """Make CurveZMQ keys: a server pair (learner, supervisor), client pairs (every process that
    connects), and KEYS_DIR/authorized/ listing the clients the servers accept. Then run with
    --set transport.keys_dir=KEYS_DIR (docs/deployment.md 'Security'). With --token, (also) a
    control token file, and with --role-keys the role keys from it."""
    from zmqrl.transport.control_keys import TokenError, parse_token, write_role_keys, write_token_file
    from zmqrl.transport.keys import SecurityError, create_keys

    if keys_dir is None and token is None:
        fail("give a KEYS_DIR to make keys in, or --token FILE for a control token (or both)", EXIT_CONFIG)
    if role_keys is not None and token is None:
        fail("--role-keys DIR derives the keys from a token: give --token FILE too", EXIT_CONFIG)
    written: list[Path] = []
    try:
        if keys_dir is not None:
            written = create_keys(keys_dir, list(client) if client else None)
        if token is not None:
            if not token.exists():
                write_token_file(token)
                written.append(token)
            elif role_keys is None:
                fail(
                    f"{token} already exists; refusing to replace a run's token (delete it first, or add "
                    "--role-keys DIR to derive role keys from it)",
                    EXIT_RUNTIME,
                )
            if role_keys is not None:
                secret = parse_token(token.read_text(encoding="ascii", errors="replace"), str(token))
                written += write_role_keys(secret, role_keys)
    except (SecurityError, TokenError, FileExistsError, ValueError, OSError) as exc:
        fail(str(exc), EXIT_RUNTIME)
    for path in written:
        typer.echo(str(path))


def show_config(config: ConfigArg, set_: SetOpt = None) -> None:
    """Print the resolved config (defaults + file + overrides) as YAML, and check it."""
    import yaml

    cfg = load(config, set_)
    typer.echo(yaml.safe_dump(cfg.to_dict(), sort_keys=False), nl=False)
