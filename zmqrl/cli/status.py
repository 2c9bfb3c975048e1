"""``zmqrl status``: the running run's dashboard, from another shell (or a script, with ``--json``).

The supervisor of a run (``launch`` or ``supervise``) answers status requests on
``supervisor.status`` and records where in ``RUN_DIR/supervisor.json``
(:mod:`zmqrl.supervisor.status`); this command reads that record (or takes ``--endpoint``), asks,
and shows the same table the supervisor's own terminal shows. After the run it prints the summary
the supervisor printed at its end (kept in the run directory, so it can be read from another
container or host on the same volume) and exits 0. When nothing answers it says why in one line
(the supervisor runs on another host or container, or it died without recording its end) and
exits 1. Without RUN_DIR it takes the newest run under ``$ZMQRL_RUN__DIR`` (set in the image), so
``docker compose exec supervisor zmqrl status`` needs no argument.

zmqrl/cli/app.py adds it to the app (:func:`register`).
"""

from __future__ import annotations

import contextlib
import json
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
            metavar="RUN_DIR",
            help="The run's directory (runs/NAME): its supervisor.json says where to ask. A directory "
            "of runs (runs/) means its newest; default: the newest under $ZMQRL_RUN__DIR, if set.",
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
    rate, weights version, policy lag), progress, returns, replay and health counters; after the
    run, when it ended and the summary its supervisor printed.

    For scripts, --json prints the snapshot as strict JSON (after the run: {"state": "finished",
    "ended", "outcome", "summary": stats.json}). Exit 0 after showing it (with --watch: on Ctrl-C,
    or when the run finished); 1 when no supervisor answers there (with the reason); 2 for bad usage.
    """
    from zmqrl.supervisor.status import StatusError, StatusRecord

    if run_dir is None and endpoint is None:
        run_dir = _default_run_dir()
    if (run_dir is None) == (endpoint is None):
        fail("give RUN_DIR (runs/NAME) or --endpoint ADDR, one of the two", EXIT_CONFIG)
    record: StatusRecord | None = None
    if run_dir is not None:
        run_dir = _newest_run(run_dir)
        record = _record(run_dir)
        if record.state == "finished":
            _show_ended(run_dir, record, as_json)
            return
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
    return record


def _default_run_dir() -> Path | None:
    """Where a bare ``zmqrl status`` looks: ``$ZMQRL_RUN__DIR`` (``/runs`` in the image), or its
    ``$ZMQRL_RUN__NAME`` when that is set too; None without them."""
    base = os.environ.get("ZMQRL_RUN__DIR")
    if not base:
        return None
    name = os.environ.get("ZMQRL_RUN__NAME")
    return Path(base) / name if name else Path(base)


def _newest_run(run_dir: Path) -> Path:
    """``run_dir`` itself when it holds a supervisor record (or is no directory: _record says so);
    for a directory of runs, the run in it whose supervisor started last (named on stderr when
    there are several to choose from)."""
    from zmqrl.supervisor.status import STATUS_RECORD, StatusError, StatusRecord

    if not run_dir.is_dir() or (run_dir / STATUS_RECORD).is_file():
        return run_dir
    runs: list[tuple[float, Path]] = []
    for sub in sorted(p for p in run_dir.iterdir() if (p / STATUS_RECORD).is_file()):
        try:
            found = StatusRecord.read(sub)
        except StatusError:
            continue
        if found is not None:
            runs.append((found.started, sub))
    if not runs:
        return run_dir
    newest = max(runs)[1]
    if len(runs) > 1:
        typer.echo(
            f"{newest}: the newest of {len(runs)} runs in {run_dir} (give RUN_DIR for another)", err=True
        )
    return newest


def _show_ended(run_dir: Path, record: Any, as_json: bool) -> None:
    """A run whose supervisor exited cleanly: when, how, and the summary it printed (exit 0)."""
    from zmqrl import strictjson
    from zmqrl.supervisor.summary import SUMMARY_TEXT

    stats: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        stats = dict(json.loads((run_dir / "stats.json").read_text()))
    outcome = str(stats.get("outcome") or "ended")
    if as_json:
        typer.echo(
            strictjson.dumps(
                {"state": "finished", "ended": record.ended, "outcome": outcome, "summary": stats}
            )
        )
        return
    when = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(record.ended or 0.0))
    how = f"finished at {when}" if outcome == "finished" else f"ended at {when}: {outcome}"
    typer.echo(
        f"run {run_dir} {how} (its supervisor, `zmqrl {record.command}` pid {record.pid} on "
        f"{record.host or '?'}, has exited)"
    )
    try:
        text = (run_dir / SUMMARY_TEXT).read_text()
    except OSError:
        text = _summary_from_stats(stats)
    typer.echo(text.rstrip("\n"))
    if not (run_dir / "stats.json").is_file():
        typer.echo(f"(no {run_dir / 'stats.json'}: its supervisor ended before writing its summary)")


def _summary_from_stats(stats: dict[str, Any]) -> str:
    """The gist of a stats.json written before the supervisor kept its summary's text."""
    learner = stats.get("learner") if isinstance(stats.get("learner"), dict) else {}
    assert isinstance(learner, dict)
    lines = [
        f"learner: updates {int(learner.get('updates', 0))}, samples {int(learner.get('samples', 0))}, "
        f"restarts {learner.get('restarts', 0)}"
    ]
    for row in stats.get("actors") or []:
        if isinstance(row, dict):
            lines.append(
                f"actor-{row.get('actor_id')}: samples {row.get('samples', 0)}, "
                f"restarts {row.get('restarts', 0)}, end {row.get('end', 'unknown')}"
            )
    return "\n".join(lines)


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
    """Why nothing answered, as far as this host can tell, and where to look next."""
    keys = " (or it refuses this client's key)" if secured else ""
    if record is None:
        return (
            f"no supervisor answers on {endpoint}{keys}: is the run still going, at this supervisor.status?"
        )
    who = f"the run's supervisor (`zmqrl {record.command}`, pid {record.pid} on host {record.host or '?'})"
    here = socket.gethostname()
    if record.host and record.host != here:
        return (
            f"{who} does not answer on {endpoint} from this host ({here}){keys}: it runs on host "
            f"{record.host}, where that address is its own (a container's loopback is the container's); "
            "ask it there (`docker compose exec supervisor zmqrl status`, `kubectl exec POD -- zmqrl "
            "status`) or give --endpoint ADDR where its supervisor.status is reachable"
            f"{_evidence(run_dir)}"
        )
    if not _pid_alive(record.pid):
        return (
            f"{who} does not answer on {endpoint}: pid {record.pid} is not running here and it did not "
            f"record an end, so it did not exit cleanly (killed?){_evidence(run_dir)}"
        )
    return (
        f"{who} is running but did not answer on {endpoint}{keys} within the timeout: it may be busy "
        "(try a longer --timeout), or that pid is another process of the same number (a container "
        f"sharing this host's name){_evidence(run_dir)}"
    )


def _evidence(run_dir: Path | None) -> str:
    """The files that can tell more, named only where they exist (compose runs have no logs/)."""
    if run_dir is None:
        return ""
    found = [str(run_dir / name) for name in ("logs", "stats.json") if (run_dir / name).exists()]
    return f"; see {' and '.join(found)}" if found else ""


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
