"""Re-run README's Results rows over their seeds and write the table (markdown + JSON).

Each row is a shipped config launched through the supervisor, once per seed, one run at a time
(so runs never share the machine's cores). "Time" is the first evaluation at the row's target
(the evaluator's when the config runs one, else the learner's), counted from the launch command's
start, start-up included; "env steps" are the transitions the learner had received by then.

Measuring the shipped configs with this checkout stores every seed's figures in
docs/results/ROW.json (a seed measured again replaces its old entry) and rewrites README's Results
table from those files, so the README's numbers come from this command, never from typing.
With ``--code DIR`` (repeatable) or ``--variant`` the same runs are made by other checkouts or
config variants too, alternating seed by seed, so versions are compared side by side on one
machine under the same conditions; such comparisons print their table and store nothing.

    python benchmarks/results.py                         # every row, its seeds; README rewritten
    python benchmarks/results.py --rows cartpole --seeds 3 --code /path/to/old/checkout
    python benchmarks/results.py --render                # README's table from docs/results/ only
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.result_rows import MINATAR_MARKS, MINATAR_PAPER, ROWS, Row  # noqa: E402
from zmqrl_bench.runs import reached_in_history, run_process, training_returns  # noqa: E402

STORE = REPO / "docs" / "results"
README = REPO / "README.md"
BEGIN = "<!-- results table: written by `python benchmarks/results.py`, do not edit by hand -->"
END = "<!-- end of results table -->"
# docs/results.md's MinAtar comparison with the paper, written from the stored rows the same way.
RESULTS_DOC = REPO / "docs" / "results.md"
MINATAR_BEGIN = "<!-- minatar table: written by `python benchmarks/results.py`, do not edit by hand -->"
MINATAR_END = "<!-- end of minatar table -->"


def own_ports(runs: Path, name: str) -> list[str]:
    """Endpoints no other run can hold: the learner's ports from the OS (the supervisor passes
    them on), the supervisor's as sockets files in the runs directory. So a results run works
    beside anything else on the machine, another zmqrl run included."""
    runs.mkdir(parents=True, exist_ok=True)
    return [
        "transport.samples=tcp://127.0.0.1:0",
        "transport.weights=tcp://127.0.0.1:0",
        f"transport.heartbeat=ipc://{runs.resolve()}/{name}.heartbeat",
        f"transport.control=ipc://{runs.resolve()}/{name}.control",
    ]


def figures(stats: dict[str, Any], target: float | None, started: float) -> dict[str, Any]:
    """One finished run's figures from its stats.json. The evaluator's evaluations count when it
    ran (its history counts ``env_steps``), else the learner's (``samples``)."""
    learner = stats.get("learner", {})
    evaluator = stats.get("evaluator")
    history = (evaluator or learner).get("eval_history") or []
    launched = float(stats.get("launched", started))
    # An untargeted row asks for an unreachable target: the same reading, never a time.
    hit = reached_in_history(
        history, math.inf if target is None else target, "env_steps" if evaluator else "samples"
    )
    means = [float(r["mean"]) for r in history if isinstance(r.get("mean"), (int, float))]
    return {
        "time_to_target": None if hit.time is None else hit.time - launched,
        "steps_at_target": hit.steps,
        "final_eval": means[-1] if means else None,
        "best_eval": hit.best,
        "evaluations": hit.evaluations,
        "updates": learner.get("updates"),
        "samples": learner.get("samples"),
        "updates_per_s": learner.get("updates_per_s"),
    }


def run_once(code: Path, row: Row, seed: int, runs: Path, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """One launch of ``row`` with ``seed`` by the checkout at ``code`` (``sets``: a variant's
    overrides, after the row's own); its figures. A run past the row's timeout is stopped, and
    every process it started is gone before this returns."""
    name = f"{row.name}-s{seed}"
    run_dir = runs / name
    overrides = (f"run.dir={runs}", f"run.seed={seed}", *own_ports(runs, name), *row.sets, *sets)
    cmd = ["env", f"PYTHONPATH={code}", sys.executable, "-m", "zmqrl", "launch", str(code / row.config)]
    cmd += ["--name", name, *(item for s in overrides for item in ("--set", s))]
    log = runs / f"{name}.log"
    started, exit_code = run_process(cmd, log, row.timeout, cwd=code)
    wall = time.time() - started
    try:
        stats = json.loads((run_dir / "stats.json").read_text())
    except (OSError, ValueError):
        stats = None
    if exit_code != 0 or not isinstance(stats, dict):
        why = "timed out" if exit_code is None else f"exit code {exit_code}"
        return {"seed": seed, "ok": False, "error": f"{why}\n{log.read_text(errors='replace')[-4000:]}"}
    result = {"seed": seed, "ok": True, **figures(stats, row.target, started), "wall_seconds": wall}
    if row.train_at:
        result["train_return"] = training_returns(run_dir / "metrics.jsonl", row.train_at)
    return result


def backfill_training_returns(kept: Path, where: Path = STORE) -> list[str]:
    """Training returns of runs kept with ``--keep`` (directories ``<row>-s<seed>``), merged into
    the stored entry of the same row and seed: for runs made before the script stored them. An
    entry whose seed was measured again since (more samples than the kept run had) is left alone.
    Returns one line per run dir, what was done."""
    done: list[str] = []
    for run_dir in sorted(p for p in kept.glob("*/*-s*") if p.is_dir()):
        name, _, seed_text = run_dir.name.rpartition("-s")
        row, path = ROWS.get(name), where / f"{name}.json"
        if row is None or not row.train_at or not seed_text.isdigit() or not path.exists():
            continue
        try:
            samples = json.loads((run_dir / "stats.json").read_text())["learner"]["samples"]
        except (OSError, ValueError, KeyError, TypeError):
            done.append(f"{run_dir}: no stats.json, skipped")
            continue
        stored = json.loads(path.read_text())
        entry = next((r for r in stored["runs"] if r["seed"] == int(seed_text)), None)
        if entry is None or entry.get("samples") != samples:
            done.append(f"{run_dir}: not the stored run of {name} seed {seed_text}, skipped")
            continue
        entry["train_return"] = training_returns(run_dir / "metrics.jsonl", row.train_at)
        path.write_text(json.dumps(stored, indent=2) + "\n")
        done.append(f"{run_dir}: {name} seed {seed_text} train_return {entry['train_return']}")
    return done


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def summarise(row: Row, results: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in results if r["ok"]]
    times = [r["time_to_target"] for r in ok if r.get("time_to_target") is not None]
    steps = [r["steps_at_target"] for r in ok if r.get("steps_at_target") is not None]
    finals = [r["final_eval"] for r in ok if r.get("final_eval") is not None]
    return {
        "runs": len(results),
        "failed": len(results) - len(ok),
        "reached": len(times),
        "median_time_to_target": _median(times),
        "min_time_to_target": min(times) if times else math.nan,
        "max_time_to_target": max(times) if times else math.nan,
        "median_steps_at_target": _median(steps),
        "ended_at_target": sum(1 for f in finals if row.target is not None and f >= row.target),
        "final_evals": finals,
        "best_evals": [r["best_eval"] for r in ok if r.get("best_eval") is not None],
        "median_updates_per_s": _median([r["updates_per_s"] for r in ok if r.get("updates_per_s")]),
        "median_wall_seconds": _median([r["wall_seconds"] for r in ok]),
    }


def _time(s: dict[str, Any]) -> str:
    if not s["reached"]:
        return "—"
    return f"{s['median_time_to_target']:.1f} s ({s['min_time_to_target']:.1f}–{s['max_time_to_target']:.1f})"


def _num(value: float) -> str:
    return f"{value:.1f}".replace("-", "−")


def _target(value: float) -> str:
    """A target return as a config states it (475, −200, 0.95), not rounded to one decimal."""
    return f"{value:g}".replace("-", "−")


def _spread(values: list[float]) -> str:
    """'median (min to max)', with true minus signs: a dash between negatives reads as one."""
    if not values:
        return "—"
    if len(values) == 1:
        return _num(values[0])
    return f"{_num(statistics.median(values))} ({_num(min(values))} to {_num(max(values))})"


def _seeds(seeds: list[int]) -> str:
    """'0–19' for a run of consecutive seeds, else the list."""
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}–{seeds[-1]}"
    return ", ".join(str(seed) for seed in seeds)


def markdown(table: dict[str, dict[str, dict[str, Any]]], rows: list[Row]) -> str:
    """A comparison: one line per row and code/variant."""
    lines = [
        "| row | code | reached target | time to target (median, min–max) | ended at target | "
        "final evals | upd/s | whole run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for code, s in table[row.name].items():
            finals = ", ".join(f"{f:.0f}" for f in s["final_evals"])
            target = "" if row.target is None else f" ≥ {row.target:g}"
            lines.append(
                f"| {row.name}{target} | {code} | {s['reached']}/{s['runs']} | {_time(s)} | "
                f"{s['ended_at_target']}/{s['runs']} | {finals} | {s['median_updates_per_s']:.0f} | "
                f"{s['median_wall_seconds']:.0f} s |"
            )
    return "\n".join(lines)


def readme_table(stored: dict[str, dict[str, Any]]) -> str:
    """README's Results table: one line per stored row, in ROWS order."""
    lines = [
        "| config | algorithm | seeds | reached target | time to target: median (min–max) | env steps at "
        "target (median) | final eval: median (min–max) | best eval | learner upd/s | whole run | measured |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, row in ROWS.items():
        if name not in stored:
            continue
        entry = stored[name]
        s = summarise(row, entry["runs"])
        sets = "".join(f" `{x}`" for x in row.sets)
        if row.target is None:
            reached = "no target"
            final = _spread(s["final_evals"])
        else:
            reached = f"≥ {_target(row.target)} on **{s['reached']}/{s['runs']}**"
            ended = f"**{s['ended_at_target']}/{s['runs']}**"
            final = (
                f"{_spread(s['final_evals'])}; ≥ {_target(row.target)} at the end on {ended}"
            )
        steps = (
            "—" if math.isnan(s["median_steps_at_target"]) else f"{s['median_steps_at_target'] / 1000:.1f}k"
        )
        seeds = _seeds([int(r["seed"]) for r in entry["runs"]])
        wall = (
            f"{s['median_wall_seconds']:.0f} s"
            if s["median_wall_seconds"] < 120
            else f"{s['median_wall_seconds'] / 60:.1f} min"
        )
        lines.append(
            f"| `{Path(row.config).relative_to('configs')}`{sets} | {row.algorithm} | {seeds} | {reached} | "
            f"{_time(s)} | {steps} | "
            f"{final} | {_spread(s['best_evals'])} | {s['median_updates_per_s']:.0f} | {wall} | "
            f"{', '.join(entry['measured'])} |"
        )
    return "\n".join(lines)


def _millions(steps: list[float]) -> str:
    if not steps:
        return "—"
    low, high = min(steps) / 1e6, max(steps) / 1e6
    return f"{low:.2f}M" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}M–{high:.2f}M"


def minatar_table(stored: dict[str, dict[str, Any]]) -> str:
    """docs/results.md's MinAtar rows against the paper: per game, the seeds, the frames a run
    reached, the training return at each mark (the mean over the seeds that stored it; which
    seeds those are), the final greedy evaluations and the paper's figure."""
    marks = MINATAR_MARKS
    header = " / ".join(f"{m / 1e6:g}M" for m in marks)
    lines = [
        f"| game | seeds | env steps in the run | training return at {header} frames: mean over seeds | "
        "final greedy eval per seed | paper's DQN (training return) |",
        "|---|---|---|---|---|---|",
    ]
    for game in MINATAR_PAPER:
        entry = stored.get(f"minatar-{game.lower()}")
        if entry is None:
            continue
        runs = [r for r in entry["runs"] if r.get("ok")]
        kept = [r for r in runs if isinstance(r.get("train_return"), dict)]
        means = []
        for mark in marks:
            values = [
                r["train_return"][str(mark)] for r in kept if r["train_return"].get(str(mark)) is not None
            ]
            # A mark that fewer of them passed says over how many seeds its mean is.
            fewer = f" ({len(values)} seed{'s' * (len(values) > 1)})" if 0 < len(values) < len(kept) else ""
            means.append(f"{_num(statistics.fmean(values))}{fewer}" if values else "—")
        trained = (
            f"{' / '.join(means)}; seed{'s' * (len(kept) > 1)} {_seeds([int(r['seed']) for r in kept])}"
            if kept
            else "not stored"
        )
        finals = ", ".join(_num(r["final_eval"]) for r in runs if r.get("final_eval") is not None)
        lines.append(
            f"| {game} | {_seeds([int(r['seed']) for r in runs])} | "
            f"{_millions([float(r['samples']) for r in runs if r.get('samples')])} | {trained} | "
            f"{finals} | {MINATAR_PAPER[game]} |"
        )
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError, StopIteration):  # Linux names the model; elsewhere, the arch
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    return f"{time.strftime('%Y-%m-%d')}, {os.cpu_count()} CPUs ({cpu})"


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def store(row: Row, results: list[dict[str, Any]], where: Path = STORE, code: str | None = None) -> None:
    """Merge ``results`` into the row's stored seeds: a seed measured again replaces its entry."""
    path = where / f"{row.name}.json"
    old = json.loads(path.read_text()) if path.exists() else {"runs": []}
    # The commit the runs were started from (``code``, taken as each run starts: a sweep takes
    # hours and the checkout may move on meanwhile), else the checkout's now.
    stamp = f"{machine()}, commit {code or commit()}"
    fresh = [{**r, "measured": stamp} for r in results]
    seeds = {r["seed"] for r in fresh}
    runs = sorted([r for r in old["runs"] if r["seed"] not in seeds] + fresh, key=lambda r: r["seed"])
    measured = sorted({r.get("measured", "unknown") for r in runs})
    where.mkdir(parents=True, exist_ok=True)
    path.write_text(
        json.dumps({"row": row.name, "command": row.command(), "measured": measured, "runs": runs}, indent=2)
        + "\n"
    )


def load_stored(where: Path = STORE) -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(where.glob("*.json")) if p.stem in ROWS}


def render_readme() -> None:
    """README's table, and docs/results.md's MinAtar table, redrawn from everything stored."""
    stored = load_stored()
    README.write_text(rewrite_readme(README.read_text(), readme_table(stored)))
    RESULTS_DOC.write_text(
        rewrite_readme(
            RESULTS_DOC.read_text(), minatar_table(stored), MINATAR_BEGIN, MINATAR_END, RESULTS_DOC
        )
    )


def rewrite_readme(
    text: str, table: str, begin: str = BEGIN, end_marker: str = END, where: Path = README
) -> str:
    """``text`` with the part between the markers replaced by ``table``."""
    start, end = text.find(begin), text.find(end_marker)
    if start < 0 or end < start:
        raise SystemExit(
            f"{where}: the markers of the results table are missing ({begin!r} ... {end_marker!r})"
        )
    return f"{text[: start + len(begin)]}\n{table}\n{text[end:]}"


def code_label(code: Path) -> str:
    return "" if code == REPO else str(code)


def parse_variant(text: str) -> tuple[str, tuple[str, ...]]:
    """'LABEL=KEY=VALUE,KEY=VALUE' -> (LABEL, overrides). Commas inside brackets belong to the
    value, so lists pass whole: 'small=agent.hidden_sizes=[128,128],learner.torch_threads=2'."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"--variant {text!r}: expected LABEL=KEY=VALUE[,KEY=VALUE...] or LABEL=")
    items, current, depth = [], "", 0
    for char in rest:
        if char == "," and depth == 0:
            items.append(current)
            current = ""
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        current += char
    items.append(current)
    return name, tuple(item for item in items if item)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of: {', '.join(ROWS)}")
    parser.add_argument("--seeds", type=int, default=None, help="seeds per row (default: the row's own)")
    parser.add_argument("--first-seed", type=int, default=0, help="seeds run from this one up")
    parser.add_argument("--code", action="append", type=Path, default=[], help="another checkout to run too")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL=KEY=VALUE[,KEY=VALUE...]",
        help="a config variant to run too, e.g. 'ratio8=learner.samples_per_insert=8' (repeatable; "
        "'LABEL=' alone is the config as shipped); variants alternate seed by seed like --code",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("runs/results"),
        help="writes OUT.md and OUT.json (default: runs/results)",
    )
    parser.add_argument("--no-store", action="store_true", help="leave docs/results/ and README as they are")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep every run's directory under KEEP (for zmqrl plot)"
    )
    parser.add_argument(
        "--render", action="store_true", help="run nothing: rewrite README from docs/results/"
    )
    parser.add_argument(
        "--train-returns-from",
        type=Path,
        default=None,
        metavar="KEEP",
        help="run nothing: store the training returns of the runs kept under KEEP (by an earlier "
        "--keep) in their rows' entries",
    )
    args = parser.parse_args()
    if args.train_returns_from:
        print("\n".join(backfill_training_returns(args.train_returns_from)) or "no kept runs found")
        return
    if args.render:
        render_readme()
        print(f"{README} and {RESULTS_DOC}: results tables rewritten from {STORE}")
        return
    unknown = [name for name in args.rows.split(",") if name not in ROWS]
    if unknown:
        raise SystemExit(f"--rows: no row {', '.join(unknown)}; the rows are {', '.join(ROWS)}")
    rows = [ROWS[name] for name in args.rows.split(",")]
    codes = [REPO, *(c.resolve() for c in args.code)]
    variants = [parse_variant(v) for v in args.variant] or [("", ())]
    runs_of = [  # (label, code, overrides): every combination, run in turn for each seed
        (" ".join(x for x in (code_label(code), name) if x) or "this checkout", code, sets)
        for code in codes
        for name, sets in variants
    ]
    storing = not args.code and not args.variant and not args.no_store  # the shipped configs, measured
    if storing:
        rewrite_readme(README.read_text(), "")  # missing markers: say so before hours of runs
        rewrite_readme(RESULTS_DOC.read_text(), "", MINATAR_BEGIN, MINATAR_END, RESULTS_DOC)
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {r.name: {lb: [] for lb, _, _ in runs_of} for r in rows}
    with tempfile.TemporaryDirectory(prefix="zmqrl-results-") as scratch:
        tmp = args.keep or scratch
        for row in rows:
            for seed in range(args.first_seed, args.first_seed + (args.seeds or row.seeds)):
                for i, (lb, code, sets) in enumerate(runs_of):  # alternate: same machine conditions
                    runs = Path(tmp) / f"{len(raw[row.name][lb])}-{i}"
                    started_at = commit()
                    result = run_once(code, row, seed, runs, sets)
                    raw[row.name][lb].append(result)
                    if storing:  # at once: an interrupted sweep keeps the seeds it measured
                        store(row, [result], code=started_at)
                        render_readme()
                    shown = {k: v for k, v in result.items() if k != "error"}
                    print(f"{row.name} {lb}: {json.dumps(shown)}", flush=True)
                    if not result["ok"]:
                        print(result["error"], file=sys.stderr)
    table = {row.name: {code: summarise(row, res) for code, res in raw[row.name].items()} for row in rows}
    text = markdown(table, rows)
    print(f"\n{machine()}\n{text}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(f"{machine()}\n\n{text}\n")
    args.out.with_suffix(".json").write_text(
        json.dumps({"machine": machine(), "summary": table, "runs": raw}, indent=2)
    )
    if storing:
        print(f"stored in {STORE}; {README}'s results table rewritten")


if __name__ == "__main__":
    main()
