"""Re-run README's Results rows over their seeds and write the table (markdown + JSON).

Each row is a shipped config launched through the supervisor, once per seed, one run at a time
(so runs never share the machine's cores). "Time" is the learner's (or, with the evaluator on,
the evaluator's) first evaluation at the row's target, counted from the launch command's start,
start-up included. With ``--code DIR`` (repeatable) the same runs are made by other checkouts
too, alternating seed by seed, so two versions of the code are measured side by side on one
machine under the same conditions.

    python benchmarks/results.py                         # every row, its seeds
    python benchmarks/results.py --rows cartpole --seeds 3 --code /path/to/old/checkout
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Row:
    name: str
    config: str
    seeds: int
    target: float
    sets: tuple[str, ...] = ()


ROWS = {
    "cartpole": Row("cartpole", "configs/cartpole_dqn.yaml", 5, 475.0),
    "pendulum": Row("pendulum", "configs/pendulum_sac.yaml", 3, -200.0),
}


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


def run_once(code: Path, row: Row, seed: int, runs: Path, sets: tuple[str, ...] = ()) -> dict[str, Any]:
    """One launch of ``row`` with ``seed`` by the checkout at ``code`` (``sets``: a variant's
    overrides, after the row's own); its figures."""
    name = f"{row.name}-s{seed}"
    run_dir = runs / name
    cmd = [
        sys.executable,
        "-m",
        "zmqrl",
        "launch",
        str(code / row.config),
        "--name",
        name,
        "--set",
        f"run.dir={runs}",
        "--set",
        f"run.seed={seed}",
        *(item for s in (*own_ports(runs, name), *row.sets, *sets) for item in ("--set", s)),
    ]
    env = {**os.environ, "PYTHONPATH": str(code)}
    started = time.time()
    proc = subprocess.run(cmd, cwd=code, env=env, capture_output=True, text=True, timeout=3600)
    wall = time.time() - started
    if proc.returncode != 0:
        return {"seed": seed, "ok": False, "error": proc.stdout[-2000:] + proc.stderr[-2000:]}
    stats = json.loads((run_dir / "stats.json").read_text())
    learner = stats.get("learner", {})
    source = stats.get("evaluator") or learner  # with the evaluator on, its evaluations count
    history = source.get("eval_history") or []
    launched = float(stats.get("launched", started))
    reached = source.get("target_time")
    return {
        "seed": seed,
        "ok": True,
        "time_to_target": reached - launched if isinstance(reached, (int, float)) else None,
        "final_eval": history[-1]["mean"] if history else None,
        "best_eval": source.get("eval_best"),
        "evaluations": len(history),
        "updates": learner.get("updates"),
        "samples": learner.get("samples"),
        "updates_per_s": learner.get("updates_per_s"),
        "wall_seconds": wall,
    }


def summarise(row: Row, results: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [r for r in results if r["ok"]]
    times = [r["time_to_target"] for r in ok if r["time_to_target"] is not None]
    finals = [r["final_eval"] for r in ok if r["final_eval"] is not None]
    return {
        "runs": len(results),
        "failed": len(results) - len(ok),
        "reached": len(times),
        "median_time_to_target": statistics.median(times) if times else math.nan,
        "min_time_to_target": min(times) if times else math.nan,
        "max_time_to_target": max(times) if times else math.nan,
        "ended_at_target": sum(1 for f in finals if f >= row.target),
        "final_evals": finals,
        "median_updates_per_s": statistics.median([r["updates_per_s"] for r in ok]) if ok else math.nan,
        "median_wall_seconds": statistics.median([r["wall_seconds"] for r in ok]) if ok else math.nan,
    }


def markdown(table: dict[str, dict[str, dict[str, Any]]], rows: list[Row]) -> str:
    lines = [
        "| row | code | reached target | time to target (median, min–max) | ended at target | "
        "final evals | upd/s | whole run |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for code, s in table[row.name].items():
            finals = ", ".join(f"{f:.0f}" for f in s["final_evals"])
            lines.append(
                f"| {row.name} ≥ {row.target:g} | {code} | {s['reached']}/{s['runs']} | "
                f"{s['median_time_to_target']:.1f} s "
                f"({s['min_time_to_target']:.1f}–{s['max_time_to_target']:.1f}) | "
                f"{s['ended_at_target']}/{s['runs']} | {finals} | {s['median_updates_per_s']:.0f} | "
                f"{s['median_wall_seconds']:.0f} s |"
            )
    return "\n".join(lines)


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
    parser.add_argument("--out", type=Path, default=Path("results"), help="writes OUT.md and OUT.json")
    args = parser.parse_args()
    rows = [ROWS[name] for name in args.rows.split(",")]
    codes = [REPO, *(c.resolve() for c in args.code)]
    variants = [parse_variant(v) for v in args.variant] or [("", ())]
    runs_of = [  # (label, code, overrides): every combination, run in turn for each seed
        (" ".join(x for x in (code_label(code), name) if x) or "this checkout", code, sets)
        for code in codes
        for name, sets in variants
    ]
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {r.name: {lb: [] for lb, _, _ in runs_of} for r in rows}
    with tempfile.TemporaryDirectory(prefix="zmqrl-results-") as tmp:
        for row in rows:
            for seed in range(args.first_seed, args.first_seed + (args.seeds or row.seeds)):
                for i, (lb, code, sets) in enumerate(runs_of):  # alternate: same machine conditions
                    runs = Path(tmp) / f"{len(raw[row.name][lb])}-{i}"
                    result = run_once(code, row, seed, runs, sets)
                    raw[row.name][lb].append(result)
                    shown = {k: v for k, v in result.items() if k != "error"}
                    print(f"{row.name} {lb}: {json.dumps(shown)}", flush=True)
                    if not result["ok"]:
                        print(result["error"], file=sys.stderr)
    table = {row.name: {code: summarise(row, res) for code, res in raw[row.name].items()} for row in rows}
    text = markdown(table, rows)
    machine = f"{platform.node()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}"
    print(f"\n{machine}\n{text}")
    args.out.with_suffix(".md").write_text(f"{machine}\n\n{text}\n")
    args.out.with_suffix(".json").write_text(
        json.dumps({"machine": machine, "summary": table, "runs": raw}, indent=2)
    )


if __name__ == "__main__":
    main()
