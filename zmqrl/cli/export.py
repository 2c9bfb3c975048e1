"""``zmqrl export`` (a checkpoint's greedy policy as ONNX), and ``zmqrl eval --onnx`` (playing one).

zmqrl/cli/app.py adds ``export`` to the app (:func:`register`); ``zmqrl eval`` (zmqrl/cli/roles.py)
hands an ``--onnx`` file to :func:`eval_onnx`. onnx, onnxruntime and torch are imported only when a
command runs, and ``eval --onnx`` never imports torch at all.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from zmqrl.cli.options import EXIT_CONFIG, EXIT_RUNTIME, SetOpt, config_path_problem, fail, require_writable


def register(app: typer.Typer) -> None:
    """Adds ``export`` to ``app``, with the example its help ends with."""
    app.command(epilog="Example: zmqrl export runs/cartpole_dqn/checkpoints/best -o policy.onnx")(export)


ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        "-c",
        metavar="FILE",
        help="Use this config (yours, e.g. the run's runs/NAME/config.yaml) instead of the one stored "
        "in the checkpoint.",
    ),
]
TrustOpt = Annotated[
    bool,
    typer.Option(
        "--trust-config",
        help="Let the checkpoint's stored config import the code it names (env.id or agent.kind as "
        "'module:...'). Only for files you trust: without it such a config is refused.",
    ),
]


def export(
    checkpoint: Annotated[
        Path,
        typer.Argument(
            help="A checkpoint file (e.g. runs/NAME/checkpoints/best), or a run directory (its latest)."
        ),
    ],
    output: Annotated[
        Path, typer.Option("--output", "-o", metavar="FILE", help="The ONNX file to write.")
    ] = Path("policy.onnx"),
    config: ConfigOpt = None,
    trust_config: TrustOpt = False,
    set_: SetOpt = None,
) -> None:
    """Export a checkpoint's greedy policy as an ONNX model: observations in, actions out, as `zmqrl
    eval` plays it (DQN's Q-argmax, SAC's squashed mean, APPO's most likely action; action bounds
    applied). A recurrent policy (APPO with agent.core lstm, R2D2) is one step of its LSTM, whose
    state the model takes and gives beside the observation and the action.

    The model's metadata holds the observation and action specs, the env section and the run's
    fingerprint; `zmqrl eval --onnx FILE` plays it without torch, and docs/export.md shows how to
    run it from plain onnxruntime. Needs the onnx extra: pip install 'zmqrl\\[onnx]'."""
    from zmqrl.checkpoints.onnx_policy import OnnxUnavailable
    from zmqrl.config import ConfigError
    from zmqrl.envs.factory import EnvError

    if not checkpoint.exists():
        fail(f"{checkpoint}: no such checkpoint file or run directory", EXIT_CONFIG)
    require_writable(output.parent, "--output")  # before minutes of export
    if config is not None and (problem := config_path_problem(config)) is not None:
        fail(problem, EXIT_CONFIG)
    try:
        from zmqrl.checkpoints.onnx_export import export_onnx

        done = export_onnx(
            checkpoint, output, config=config, overrides=list(set_ or []), trust_config=trust_config
        )
    except OnnxUnavailable as exc:
        fail(str(exc), EXIT_RUNTIME)
    except (ConfigError, EnvError) as exc:
        fail(" ".join(str(exc).split()), EXIT_CONFIG)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        fail(str(exc), EXIT_RUNTIME)
    meta = done.metadata
    action = f"{meta.action.n} actions" if meta.action.n is not None else f"{list(meta.action.shape)} float32"
    typer.echo(
        f"{done.path}: {meta.agent} greedy policy of {meta.checkpoint} (weights version "
        f"{meta.weights_version}), obs {meta.observation_text()} -> {action}"
        f"{f', LSTM state of {meta.core}' if meta.core else ''}, {done.size} bytes"
    )


def eval_onnx(
    onnx: Path,
    episodes: int,
    seed: int,
    overrides: list[str],
    config: Path | None,
    trust_config: bool,
) -> None:
    """``zmqrl eval --onnx FILE``: play the exported policy and print its score, or one error line
    (exit 2 for a config or env problem, 1 for the rest: a missing extra, an unreadable model)."""
    from zmqrl.checkpoints.onnx_policy import OnnxUnavailable
    from zmqrl.config import ConfigError
    from zmqrl.envs.factory import EnvError
    from zmqrl.evaluator.onnx_eval import evaluate_onnx

    if not onnx.is_file():
        fail(f"{onnx}: no such ONNX file", EXIT_CONFIG)
    try:
        result = evaluate_onnx(onnx, episodes, seed, overrides, config=config, trust_config=trust_config)
    except OnnxUnavailable as exc:
        fail(str(exc), EXIT_RUNTIME)
    except (ConfigError, EnvError) as exc:
        fail(" ".join(str(exc).split()), EXIT_CONFIG)
    except (ValueError, KeyError, RuntimeError, OSError) as exc:
        fail(str(exc), EXIT_RUNTIME)
    typer.echo(played_line(onnx, result.mean, result.std, result.returns, result.lengths))


def played_line(source: Path, mean: float, std: float, returns: list[float], lengths: list[int]) -> str:
    """``zmqrl eval``'s one summary line, for a checkpoint or an exported policy alike."""
    return (
        f"{source}: mean return {mean:.1f} ± {std:.1f} over {len(returns)} episodes "
        f"(min {min(returns):.1f}, max {max(returns):.1f}, mean length {sum(lengths) / len(lengths):.0f})"
    )
