"""The snapshot on a terminal: the live dashboard (rich) and the one-line form for logs and pipes.

Laid out for a 100x30 terminal: a header, the progress bar, a table with a row per process (the
first ``max_rows``), then four lines of run-wide figures, and the no-progress warning when the
run has one. A value not measured shows as "-"; a health counter that just rose shows in bold red
with its rise ("+3")."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from zmqrl.metrics import fmt_value
from zmqrl.supervisor.snapshot import ProcessRow, RunSnapshot
from zmqrl.supervisor.snapshot_fields import finite

# Eight heights, lowest first.
SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
# Process rows shown before "... N more" (keeps a 30-line terminal enough for the rest).
MAX_ROWS = 16
PROGRESS_BAR_WIDTH = 40
RISING_STYLE = "bold red"
NO_PROGRESS_STYLE = "bold yellow"
STATE_STYLES = {
    "running": "green",
    "finished": "dim",
    "stopped": "dim",
    "failed": "bold red",
    "given up": "bold red",
    "down": "bold red",
}
COUNTER_LABELS = {
    "bad_messages": "bad",
    "stale_batches": "stale",
    "lost_batches": "lost",
    "reordered_batches": "reordered",
    "restarts": "restarts",
}


def sparkline(values: Sequence[float], width: int = 20) -> str:
    """The latest ``width`` values as block heights between their min and max (a flat history
    sits mid-height; a value not measured is a space)."""
    tail = list(values)[-width:] if width > 0 else []
    seen = [v for v in (finite(x) for x in tail) if v is not None]
    if not seen:
        return " " * len(tail) if tail else ""
    lo, hi = min(seen), max(seen)
    top = len(SPARK_BLOCKS) - 1
    out = []
    for x in tail:
        v = finite(x)
        if v is None:
            out.append(" ")
        elif hi == lo:
            out.append(SPARK_BLOCKS[top // 2])
        else:
            out.append(SPARK_BLOCKS[round((v - lo) / (hi - lo) * top)])
    return "".join(out)


def fmt_number(value: float | None, digits: int = 1) -> str:
    """``digits`` decimals below 100, none above (a rate of 812.4 reads better as 812); "-" when
    not measured."""
    v = finite(value)
    if v is None:
        return "-"
    return f"{v:.0f}" if abs(v) >= 100 else f"{v:.{digits}f}"


def fmt_duration(seconds: float | None) -> str:
    s = finite(seconds)
    if s is None:
        return "-"
    s = max(0.0, s)
    if s < 60:
        return f"{s:.0f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"


def _share(value: float | None) -> str:
    v = finite(value)
    return f"{v * 100:.0f}%" if v is not None else "-"


def render_dashboard(snap: RunSnapshot, max_rows: int = MAX_ROWS) -> RenderableType:
    """The whole live view of one snapshot."""
    return Group(
        _header(snap),
        _progress(snap),
        _processes(snap, max_rows),
        Text(""),
        _returns(snap),
        _replay(snap),
        _counters(snap),
        *([_no_progress(snap.no_progress)] if snap.no_progress else []),
    )


def _no_progress(message: str) -> Table:
    """The warning under its label, a long one wrapped under itself (not under the label)."""
    grid = Table.grid()
    grid.add_column(no_wrap=True)
    grid.add_column()
    grid.add_row(Text(_label("warning")[0], style="bold"), Text(message, style=NO_PROGRESS_STYLE))
    return grid


def _header(snap: RunSnapshot) -> Text:
    text = Text.assemble(("zmqrl ", "bold"), (snap.run_dir, "cyan"), "  ")
    text.append(snap.state, style="bold green" if snap.state == "running" else "bold yellow")
    text.append(f"  elapsed {fmt_duration(snap.elapsed)}")
    return text


def _progress(snap: RunSnapshot) -> Table:
    done = min(1.0, max(0.0, finite(snap.progress) or 0.0))
    grid = Table.grid(padding=(0, 1))
    grid.add_row(
        Text(snap.progress_label or "progress"),
        ProgressBar(total=1.0, completed=done, width=PROGRESS_BAR_WIDTH),
        Text(f"{done * 100:3.0f}%", style="bold"),
        Text(f"ETA {fmt_duration(snap.eta_seconds)}"),
    )
    return grid


def _processes(snap: RunSnapshot, max_rows: int) -> Table:
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, expand=False)
    for name, justify in (
        ("process", "left"),
        ("pid/host", "left"),
        ("state", "left"),
        ("beat", "right"),
        ("restarts", "right"),
        ("rate", "right"),
        ("weights", "right"),
        ("lag", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    rows = snap.processes
    for row in rows[:max_rows]:
        table.add_row(*_cells(row))
    if len(rows) > max_rows:
        more = len(rows) - max_rows
        table.add_row(Text(f"... {more} more", style="dim"), "", "", "", "", "", "", "")
    return table


def _cells(row: ProcessRow) -> list[Text]:
    where = str(row.pid) if row.pid is not None else "-"
    if row.host:
        where = f"{where}@{row.host}"
    style = STATE_STYLES.get(row.state, "yellow")
    age = f"{row.heartbeat_age:.1f} s" if row.heartbeat_age is not None else "-"
    rate = fmt_number(row.rate)
    if row.rate_unit == "evals":
        rate = f"{rate[:-2] if rate.endswith('.0') else rate} evals"
    elif rate != "-":
        rate = f"{rate} {row.rate_unit}"
    return [
        Text(row.name, style="bold"),
        Text(where),
        Text(row.state, style=style),
        Text(age),
        Text(str(row.restarts), style="yellow" if row.restarts else ""),
        Text(rate),
        Text(f"v{row.weights_version}" if row.weights_version is not None else "-"),
        Text(fmt_number(row.policy_lag)),
    ]


def _label(name: str) -> tuple[str, str]:
    """A section's name, padded so that the figures after it line up."""
    return f"{name:<9}", "bold"


def _returns(snap: RunSnapshot) -> Text:
    text = Text.assemble(_label("return"), f"train {fmt_value(snap.train_return)} | ")
    text.append(f"eval {fmt_value(snap.eval_return)} (best {fmt_value(snap.eval_best)})")
    n = len(snap.eval_history)
    if n:
        text.append(f"  {sparkline(snap.eval_history)}", style="cyan")
        text.append(f" (last {n} eval{'s' if n != 1 else ''})", style="dim")
    return text


def _replay(snap: RunSnapshot) -> Group:
    fill = snap.replay_fill
    size = Text.assemble(_label(snap.replay_label), f"{snap.replay_size}/{snap.replay_capacity}")
    size.append(f" ({_share(fill)} full)" if fill is not None else "")
    size.append(f" | limiter: learner waited {_share(snap.limiter_wait_share)}")
    size.append(f", ingest held {_share(snap.insert_wait_share)}")
    flow = Text.assemble(_label("samples"), f"in {fmt_number(snap.samples_in_per_s)}/s")
    flow.append(f" | trained {fmt_number(snap.samples_trained_per_s)}/s")
    flow.append(f" | replay ratio {fmt_number(snap.replay_ratio, 2)}")
    return Group(size, flow)


def _counters(snap: RunSnapshot) -> Text:
    text = Text.assemble(_label("messages"))
    for i, (key, value) in enumerate(snap.counters.items()):
        if i:
            text.append(" | ")
        label = f"{COUNTER_LABELS.get(key, key.replace('_', ' '))} {value}"
        if key in snap.rising:
            text.append(label, style=RISING_STYLE)
            text.append(f" +{snap.rises.get(key, 0)}", style=RISING_STYLE)
        else:
            text.append(label)
    if "bad_messages" in snap.rising and snap.bad_latest:
        text.append(f"\nlatest dropped: {snap.bad_latest}", style=RISING_STYLE)
    return text


def plain_line(snap: RunSnapshot) -> str:
    """One progress line for a log or a pipe (the supervisor's line before the dashboard: tests
    and scripts grep its parts, so their order and spelling stay)."""
    learner = next((r for r in snap.processes if r.role == "learner"), None)
    actors = [r for r in snap.processes if r.role == "actor"]
    upd_s = finite(learner.rate) if learner is not None else None
    steps_s = sum(finite(a.rate) or 0.0 for a in actors)
    line = (
        f"updates {snap.updates}/{snap.max_updates} | samples {snap.samples} | "
        f"{upd_s or 0.0:.0f} upd/s | "
        f"eval {fmt_value(snap.eval_return)} (best {fmt_value(snap.eval_best)}) | "
        f"actors {snap.actors_alive}/{len(actors)}, {steps_s:.0f} steps/s | "
        f"{snap.replay_label} {snap.replay_size}/{snap.replay_capacity}"
    )
    if snap.rising:
        line += " | " + ", ".join(f"{k} +{snap.rises.get(k, 0)}" for k in snap.rising)
        if "bad_messages" in snap.rising and snap.bad_latest:
            line += f" (latest: {snap.bad_latest})"
    if snap.no_progress:  # last: the parts before keep their places
        line += f" | {snap.no_progress}"
    return line
