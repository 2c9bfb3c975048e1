"""``zmqrl slurm``: write the sbatch script that runs one zmqrl run on a Slurm allocation.

Slurm starts the batch script on the allocation's first node, so the script runs the learner and
the watch-only supervisor (and the evaluator, when the config enables it) right there, and the
actors as one ``srun`` step on the other nodes (on the first node too when the allocation has only
one). Nothing about the cluster is known when the script is written: the first node's name, its
address and the ports are worked out inside the job, so one script runs on any allocation of its
shape. What it writes is plain bash with a comment per step, meant to be read and edited.

Why keys by default: a cluster's nodes share a private network, but so do every other user's
jobs, and the learner takes samples from anyone who reaches its port. ``zmqrl keys`` costs a
fraction of a second, so the job makes a CurveZMQ key set in its run directory (a shared file
system, which every node reads) on its first start and reuses it on a resubmission. ``--insecure``
leaves the data channels in plaintext (``transport.insecure=true``) and authenticates the control
plane with a token file that the supervisor writes instead.

zmqrl/cli/app.py adds the command to the app (:func:`register`).
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from zmqrl.cli.options import EXIT_CONFIG, ConfigArg, SetOpt, fail, load
from zmqrl.cli.slurm_script import (
    PORT_RANGE_START,
    PORT_SLOTS,
    PORT_STRIDE,
    PORTS_PER_JOB,
    STOP_BEFORE_LIMIT_S,
    SlurmJob,
    header_problem,
    render_script,
)

# Settings the script derives from the allocation; a --set of one would be replaced, so it is refused.
DERIVED_KEYS = (
    "transport.samples",
    "transport.weights",
    "transport.heartbeat",
    "transport.control",
    "transport.keys_dir",
    "transport.control_token_file",
    "transport.control_keys_dir",
)
# What a --time, --partition or --sbatch value may contain: no spaces, which would end the option
# on its #SBATCH line, and no line breaks or other control characters, which would start a line of
# script (zmqrl/cli/slurm_script.py, HEADER_CONTROL).
SAFE_DIRECTIVE = re.compile(r"[^\s\x00-\x1f\x7f]+")


def register(app: typer.Typer) -> None:
    """Adds ``slurm`` to ``app``, with the example its help ends with."""
    app.command(
        epilog="Example: zmqrl slurm configs/cartpole_dqn.yaml --nodes 3 -o job.sbatch && sbatch job.sbatch"
    )(slurm)


def slurm(
    config: ConfigArg,
    nodes: Annotated[
        int,
        typer.Option(
            "--nodes", "-N", min=1, help="Nodes to ask for: the learner takes the first, actors the rest."
        ),
    ] = 2,
    actors_per_node: Annotated[
        int | None,
        typer.Option(
            "--actors-per-node",
            min=1,
            help="Actor processes on each actor node (default: actor.num_actors spread over the actor "
            "nodes, rounded up). actor.num_actors is set to the total.",
        ),
    ] = None,
    cpus_per_actor: Annotated[
        int, typer.Option("--cpus-per-actor", min=1, help="CPUs Slurm gives each actor (--cpus-per-task).")
    ] = 1,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time",
            "-t",
            metavar="LIMIT",
            help=f"The job's time limit in Slurm's format (2:00:00, 1-12:00:00). {STOP_BEFORE_LIMIT_S} s "
            "before it the run is stopped cleanly, after a final checkpoint.",
        ),
    ] = None,
    partition: Annotated[
        str | None, typer.Option("--partition", "-p", help="The partition to submit to.")
    ] = None,
    sbatch_options: Annotated[
        list[str] | None,
        typer.Option(
            "--sbatch",
            metavar="OPTION",
            help="One more #SBATCH line, as sbatch takes it: --sbatch=--account=abc, --sbatch=--gres=gpu:1 "
            "(repeatable).",
        ),
    ] = None,
    port_base: Annotated[
        int,
        typer.Option(
            "--port-base",
            min=0,
            max=65535 - PORTS_PER_JOB,
            help="First of the five ports used on the first node (samples, weights, heartbeat, control, "
            f"Prometheus on 127.0.0.1). 0: {PORT_RANGE_START} + (job id % {PORT_SLOTS}) x {PORT_STRIDE}, "
            "so jobs sharing a node do not collide.",
        ),
    ] = 0,
    interface: Annotated[
        str | None,
        typer.Option(
            "--interface",
            metavar="IFACE",
            help="Use the first node's IPv4 address on this interface (e.g. ib0 for InfiniBand) for the "
            "learner and supervisor to bind and the actors to connect to. Default: the address the first "
            "node's name resolves to there. ZMQRL_ADDRESS at submission wins over both.",
        ),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option(
            "--insecure",
            help="No CurveZMQ keys: plaintext data channels (transport.insecure=true), heartbeats and "
            "control with the run's token file. Only where nobody else can reach the nodes.",
        ),
    ] = False,
    python: Annotated[
        str | None,
        typer.Option(
            "--python",
            metavar="PATH",
            help="The Python with zmqrl installed, on every node (default: this one). ZMQRL_PYTHON at "
            "submission wins.",
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", metavar="FILE", help="Write the script here (default: print it)."),
    ] = None,
    set_: SetOpt = None,
) -> None:
    """Write an sbatch script that runs this config on a Slurm allocation; submit it with sbatch.

    The learner, the watch-only supervisor (its progress lines are the job's output) and the
    evaluator (if evaluator.enabled) run on the first node; actors run with srun on the other nodes,
    or on the first one when --nodes is 1. Endpoints come from the allocation: the first node's
    address and fixed or job-derived ports. The job makes CurveZMQ keys in RUN_DIR/keys (or
    --insecure). It ends when the learner ends, stops every srun step, and exits with the run's
    code: 0 finished, 1 failed, 2 a setting to fix, 143 stopped (scancel, or the time limit near).
    The learner starts with --resume, so a job submitted again continues from its newest
    checkpoint. Logs: RUN_DIR/logs/. See docs/slurm.md."""
    overrides = list(set_ or [])
    for item in overrides:
        key = item.partition("=")[0].strip()
        if key in DERIVED_KEYS:
            fail(
                f"--set {key}: the script sets it from the allocation; use --interface, --port-base or "
                "--insecure instead",
                EXIT_CONFIG,
            )
    for name, value in (
        ("--time", time_limit),
        ("--partition", partition),
        *(("--sbatch", v) for v in sbatch_options or []),
    ):
        if value is not None and not SAFE_DIRECTIVE.fullmatch(value):
            fail(
                f"{name} {value!r}: no spaces, line breaks or control characters in an #SBATCH value",
                EXIT_CONFIG,
            )
    for value in sbatch_options or []:
        if not value.startswith("-"):
            fail(f"--sbatch {value!r}: give an sbatch option, e.g. --sbatch=--account=abc", EXIT_CONFIG)
    workdir = Path.cwd()
    problem = header_problem(str(workdir))
    if problem is not None:  # the job's #SBATCH --chdir: the one path on a line bash does not quote
        fail(
            f"the working directory {str(workdir)!r}: {problem}; run zmqrl slurm from a directory "
            "whose path has none (the job starts there and writes slurm-JOBID.out there)",
            EXIT_CONFIG,
        )
    from zmqrl.config import SupervisorConfig

    cfg = load(config, overrides)
    actor_nodes = max(nodes - 1, 1)
    per_node = actors_per_node or -(-cfg.actor.num_actors // actor_nodes)
    job = SlurmJob(
        config=config.resolve(),
        run_root=Path(cfg.run.dir).resolve(),
        run_dir=Path(cfg.run.dir).resolve() / cfg.run.name,
        workdir=workdir,
        python=python or sys.executable,
        nodes=nodes,
        actors_per_node=per_node,
        cpus_per_actor=cpus_per_actor,
        time=time_limit,
        partition=partition,
        job_name=job_name(cfg.run.name),
        port_base=port_base,
        interface=interface,
        insecure=insecure,
        evaluator=cfg.evaluator.enabled,
        stop_grace=cfg.supervisor.stop_grace,
        # The default port would collide between two jobs on one node; a chosen one is kept.
        metrics_port=cfg.supervisor.metrics_http == SupervisorConfig.metrics_http,
        overrides=overrides,
        sbatch=list(sbatch_options or []),
    )
    try:
        text = render_script(job)
    except ValueError as exc:  # a value no #SBATCH line can hold (a " in --partition): named there
        fail(f"{exc}; give a value without it", EXIT_CONFIG)
    if output is None:
        typer.echo(text, nl=False)
        return
    output.write_text(text)
    output.chmod(0o755)
    typer.echo(f"wrote {output}: submit it with sbatch {shlex.quote(str(output))}", err=True)


def job_name(run_name: str) -> str:
    """``zmqrl-<run name>``, in the characters every Slurm tool prints as they are."""
    return "zmqrl-" + re.sub(r"[^A-Za-z0-9_.-]", "_", run_name)[:64]
