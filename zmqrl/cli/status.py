"""``zmqrl status``: the running run's dashboard, from another shell (or a script, with ``--json``).

The supervisor of a run (``launch`` or ``supervise``) answers status requests on
``supervisor.status`` and records where in ``RUN_DIR/supervisor.json``
(:mod:`zmqrl.supervisor.status`); this command reads that record (or takes ``--endpoint``), asks,
and shows the same table the supervisor's own terminal shows. When nothing runs there it says
what is wrong in one line and exits 1.

zmqrl/cli/app.py adds it to the app (:func:`register`).
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from zmqrl.cli.options import EXIT_CONFIG, EXIT_RUNTIME, fail

# Seconds to wait for the supervisor's answer (its loop answers within about 0.1 s).
DEFAULT_TIMEOUT = 3.0
# Seconds between refreshes with --watch.
DEFAULT_INTERVAL = 1.0


def register(app: typer.Typer) -> None:
    """Adds ``status`` to ``app``, with the example its help ends with."""
    app.command(epilog="Example: zmqrl status runs/cartpole --watch")(status)


def status(
    run_dir: Annotated[
        Path | None,
        typer.Argument(
            metavar="RUN_DIR", help="The run's directory (runs/NAME): its supervisor.json says where to ask."
        ),
    ] = None,
    endpoint: Annotated[
        str | None,
        typer.Option(
            "--endpoint", metavar="ADDR", help="Ask the supervisor at ADDR (its supervisor.status) instead."
        ),
    ] = None,
    watch: Annotated[
        bool, typer.Option("--watch", "-w", help="Keep the table up to date until Ctrl-C or the run ends.")
    ] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.1, help="Seconds between refreshes with --watch.")
    ] = DEFAULT_INTERVAL,
    timeout: Annotated[
        float, typer.Option("--timeout", min=0.1, help="Seconds to wait for the supervisor's answer.")
    ] = DEFAULT_TIMEOUT,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print the snapshot as strict JSON (one line; with --watch, one line each time)."
        ),
    ] = False,
    keys_dir: Annotated[
        Path | None,
        typer.Option(
            "--keys-dir",
            metavar="DIR",
            help="CurveZMQ keys to ask with (default: the run's transport.keys_dir, from its record).",
        ),
    ] = None,
) -> None:
    """Show a running run's dashboard: its processes (state, pid@host, heartbeat age, restarts,
    rate, weights version, policy lag), progress, returns, replay and health counters.

    For scripts, --json prints the snapshot as strict JSON. Exit 0 after showing it (with --watch:
    on Ctrl-C, or when the run finished); 1 when no supervisor answers there (with the reason); 2
    for bad usage.
    """
    from zmqrl.supervisor.status import StatusError, StatusRecord

    if (run_dir is None) == (endpoint is None):
        fail("give RUN_DIR (runs/NAME) or --endpoint ADDR, one of the two", EXIT_CONFIG)
    record: StatusRecord | None = None
    if run_dir is not None:
        record = _record(run_dir)
        endpoint = record.endpoint
    assert endpoint is not None
    security = _security(keys_dir, record)
    from zmqrl.supervisor.status import StatusClient

    client = StatusClient(endpoint, security=security)
    try:
        try:
            snap = client.fetch(timeout)
        except StatusError as exc:
            fail(str(exc), EXIT_RUNTIME)
        if snap is None:
            fail(_no_answer(endpoint, record, run_dir, security is not None), EXIT_RUNTIME)
        if not watch:
            _show_once(snap, as_json)
            return
        _watch(client, snap, record, run_dir, as_json, interval, timeout, security is not None)
    finally:
        client.close()


def _record(run_dir: Path) -> Any:
    """The run directory's supervisor record, or exit 1 saying why there is none."""
    from zmqrl.supervisor.status import STATUS_RECORD, StatusError, StatusRecord

    if not run_dir.is_dir():
        fail(f"no run directory {run_dir}: give a runs/NAME (or --endpoint ADDR)", EXIT_RUNTIME)
    try:
        record = StatusRecord.read(run_dir)
    except StatusError as exc:
        fail(str(exc), EXIT_RUNTIME)
    if record is None:
        fail(
            f"no supervisor has run in {run_dir} (no {STATUS_RECORD}): start one with `zmqrl launch CONFIG`",
            EXIT_RUNTIME,
        )
    if record.state == "finished":
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(record.ended or 0.0))
        fail(
            f"the run in {run_dir} has finished (its supervisor, pid {record.pid}, exited at {when}): "
            f"its summary is in {run_dir / 'stats.json'}",
            EXIT_RUNTIME,
        )
    return record


def _security(keys_dir: Path | None, record: Any) -> Any:
    """The client keys to ask with: --keys-dir, else the run's own (named in its record), else
    none (plaintext, as the supervisor listens without keys)."""
    from zmqrl.transport.keys import Security, SecurityError

    directory = keys_dir
    if directory is None and record is not None and record.keys_dir:
        directory = Path(record.keys_dir)
    if directory is None:
        return None
    name = record.key_name if record is not None else "client"
    try:
        return Security.load(directory, client=name)
    except SecurityError as exc:
        fail(" ".join(str(exc).split()), EXIT_RUNTIME)


def _no_answer(endpoint: str, record: Any, run_dir: Path | None, secured: bool) -> str:
    keys = " (or it refuses this client's key)" if secured else ""
    if record is None:
        return (
            f"no supervisor answers on {endpoint}{keys}: is the run still going, at this supervisor.status?"
        )
    gone = ""
    if record.host == socket.gethostname() and not _pid_alive(record.pid):
        gone = f"; pid {record.pid} is not running here, so it did not exit cleanly (killed?)"
    return (
        f"the run's supervisor (pid {record.pid}) does not answer on {endpoint}{keys}: it has probably "
        f"exited{gone}; see {run_dir}/logs/ and {run_dir}/stats.json"
    )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _show_once(snap: Any, as_json: bool) -> None:
    from zmqrl import strictjson
    from zmqrl.supervisor.render import render_dashboard

    if as_json:
        typer.echo(strictjson.dumps(snap.to_dict()))
        return
    from rich.console import Console

    Console().print(render_dashboard(snap))


def _watch(
    client: Any,
    snap: Any,
    record: Any,
    run_dir: Path | None,
    as_json: bool,
    interval: float,
    timeout: float,
    secured: bool,
) -> None:
    """Refresh until Ctrl-C (exit 0) or the supervisor stops answering: "run finished" (exit 0) if
    its record says so within ``timeout`` (it is marked after the summary), else exit 1."""
    from zmqrl.supervisor.status import StatusError, StatusRecord

    def next_snapshot() -> Any:
        time.sleep(interval)
        try:
            return client.fetch(timeout)
        except StatusError as exc:
            fail(str(exc), EXIT_RUNTIME)

    try:
        if as_json:
            while snap is not None:
                _show_once(snap, as_json=True)
                snap = next_snapshot()
        else:
            from rich.console import Console
            from rich.live import Live

            from zmqrl.supervisor.render import render_dashboard

            with Live(render_dashboard(snap), console=Console(), auto_refresh=False) as live:
                while (snap := next_snapshot()) is not None:
                    live.update(render_dashboard(snap), refresh=True)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    # No answer any more: the run ended, or its supervisor died.
    deadline = time.monotonic() + timeout
    while run_dir is not None and time.monotonic() < deadline:
        try:
            ended = StatusRecord.read(run_dir)
        except StatusError:
            ended = None
        if ended is not None and ended.state == "finished":
            typer.echo("run finished", err=as_json)  # with --json, stdout stays JSON lines
            return
        time.sleep(0.1)
    fail(_no_answer(client.endpoint, record, run_dir, secured), EXIT_RUNTIME)
