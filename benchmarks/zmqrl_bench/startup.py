"""``zmqrl bench`` start-up part: how long ``zmqrl launch`` takes to the learner's first update.

Each repeat runs the real command (``python -m zmqrl launch configs/cartpole_dqn.yaml``, on free
ports, until a few updates are made) and reads what the run left: the learner's start-up marks
(learner-stats.json ``startup``: sockets bound (before torch's import), torch imported, first
weights, replay warm, first update, in seconds after the launch) and each role's log (its first
line: the process is up and its CLI loaded; its "up" line: its sockets are bound or connected).
Repeats with and without the evaluator alternate, so what the evaluator adds is measured side by
side. Each role's import time is ``python -X importtime -c "import <its main module>"`` in a
fresh interpreter, alternated with ``import torch`` alone: the part of a role's start-up that
torch is.

Rows: launch -> first update against the 2 s target (the ratio is to 2 s: at most 1 meets it),
the same with the evaluator against without it, each role's import time, and when each role
was up (the evaluator starts once the learner is up, and a run that ends first may stop it
before it is: its row says in how many runs it was). The command's own interpreter start is
counted: the clock starts before the ``python -m zmqrl launch`` process is created.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from zmqrl_bench.report import BenchSettings, Comparison, Stat

# Seconds (full, quick) this part takes, for `zmqrl bench`'s progress line.
SECONDS = (100, 50)
# The target: from `zmqrl launch` to the learner's first update.
TARGET_SECONDS = 2.0
# The config measured, relative to the repository (the package's parent directory).
CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cartpole_dqn.yaml"
# Updates each launched run makes: a few past the first, so the run ends soon after it.
RUN_UPDATES = 20
# A launch that has not finished by then failed (seconds).
LAUNCH_TIMEOUT = 120.0
# The learner's start-up marks, in the order they happen (zmqrl/learner/main.py).
MARKS = ("bound", "imported", "first_weights", "replay_ready", "first_update")
# Each role's main module, whose import is that role's import time ("cli": what every command loads).
ROLE_MODULES = {
    "cli": "zmqrl.cli.app",
    "supervisor": "zmqrl.supervisor.launch",
    "learner": "zmqrl.learner.main",
    "actor": "zmqrl.actor.main",
    "evaluator": "zmqrl.evaluator.main",
}
# How a role's log says it is up (its sockets bound or connected).
UP_LINES = {"learner": "learner up:", "actor": " up: ", "evaluator": "evaluator up:"}
LOG_TIME_FORMAT = "%Y-%m-%d %H:%M:%S.%f"


@dataclass
class Launch:
    """One measured ``zmqrl launch``: seconds from before the command's process was created."""

    first_update: float  # to the learner's first update
    marks: dict[str, float]  # the learner's start-up marks, from the same clock start
    roles_started: dict[str, float] = field(default_factory=dict)  # role log's first line
    roles_up: dict[str, float] = field(default_factory=dict)  # role log's "up" line


def free_ports(count: int) -> list[int]:
    """``count`` distinct ports the OS reports free on 127.0.0.1 now."""
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def launch_command(root: Path, name: str, evaluator: bool, config: Path = CONFIG) -> list[str]:
    """The measured command: the config's own learning settings, on free fixed ports (so the
    supervisor starts the actors at once, as with the config's defaults), metrics HTTP off."""
    samples, weights, heartbeat, control = free_ports(4)
    sets = {
        "run.dir": str(root),
        "learner.max_updates": str(RUN_UPDATES),
        "evaluator.enabled": "true" if evaluator else "false",
        "transport.samples": f"tcp://127.0.0.1:{samples}",
        "transport.weights": f"tcp://127.0.0.1:{weights}",
        "transport.heartbeat": f"tcp://127.0.0.1:{heartbeat}",
        "transport.control": f"tcp://127.0.0.1:{control}",
        "supervisor.metrics_http": "null",
    }
    cmd = [sys.executable, "-m", "zmqrl", "launch", str(config), "--plain", "--name", name]
    for key, value in sets.items():
        cmd += ["--set", f"{key}={value}"]
    return cmd


def _log_time(line: str) -> float | None:
    try:
        return datetime.strptime(line[:23], LOG_TIME_FORMAT).timestamp()
    except ValueError:
        return None


def role_times(logs: Path, start: float) -> tuple[dict[str, float], dict[str, float]]:
    """From each role's log: when its first line and its "up" line were written, in seconds
    after ``start`` (Unix seconds)."""
    started: dict[str, float] = {}
    up: dict[str, float] = {}
    for log in sorted(logs.glob("*.log")):
        role = log.stem.rsplit("-", 1)[0]
        for line in log.read_text(errors="replace").splitlines():
            when = _log_time(line)
            if when is None:
                continue
            started.setdefault(log.stem, round(when - start, 3))
            if UP_LINES.get(role, "\0") in line:
                up[log.stem] = round(when - start, 3)
                break
    return started, up


def launch_once(root: Path, name: str, evaluator: bool, config: Path = CONFIG) -> Launch:
    """Run ``zmqrl launch`` once to its end and read when things happened."""
    cmd = launch_command(root, name, evaluator, config)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    start = time.time()
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )
    try:
        out, _ = proc.communicate(timeout=LAUNCH_TIMEOUT)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise RuntimeError(f"zmqrl launch did not finish within {LAUNCH_TIMEOUT:.0f} s") from None
    run_dir = root / name
    stats_path = run_dir / "learner-stats.json"
    if proc.returncode != 0 or not stats_path.exists():
        tail = out.decode(errors="replace").splitlines()[-20:]
        raise RuntimeError(f"zmqrl launch exited {proc.returncode}:\n" + "\n".join(tail))
    stats = json.loads(stats_path.read_text())
    offset = float(stats["launched"]) - start  # the launch's own clock starts after the interpreter
    marks = {k: round(v + offset, 3) for k, v in stats["startup"].items()}
    started, up = role_times(run_dir / "logs", start)
    return Launch(marks["first_update"], marks, started, up)


def import_seconds(module: str) -> float:
    """Cumulative import time of ``module`` in a fresh interpreter (``-X importtime``)."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", f"import {module}"],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    for line in reversed(out.splitlines()):
        parts = [p.strip() for p in line.split("|")]
        if len(parts) == 3 and parts[2] == module:
            return int(parts[1]) / 1e6
    raise RuntimeError(f"no import time reported for {module}")


def imports_torch(module: str) -> bool:
    """Whether importing ``module`` imports torch (the actor and the supervisor must not)."""
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def _median_of(launches: list[Launch], key: str, where: str) -> float | None:
    values = [getattr(run, where)[key] for run in launches if key in getattr(run, where)]
    return round(statistics.median(values), 3) if values else None


def _phases(launches: list[Launch]) -> dict[str, float]:
    """Medians of the learner's marks, and the warm-up (first weights to replay ready)."""
    out: dict[str, float] = {}
    for mark in MARKS:
        value = _median_of(launches, mark, "marks")
        if value is not None:
            out[f"learner_{mark}_s"] = value
    warm = [
        run.marks["replay_ready"] - run.marks["first_weights"]
        for run in launches
        if "replay_ready" in run.marks
    ]
    if warm:
        out["warmup_s"] = round(statistics.median(warm), 3)
    return out


def _up_note(name: str, launches: list[Launch]) -> str:
    seen = sum(name in run.roles_up for run in launches)
    return f"with the evaluator; up in {seen} of {len(launches)} runs"


def launch_rows(settings: BenchSettings, root: Path) -> list[Comparison]:
    """Launch -> first update, without and with the evaluator, alternated repeat by repeat."""
    plain: list[Launch] = []
    with_eval: list[Launch] = []
    for i in range(settings.repeats):
        plain.append(launch_once(root, f"startup-{i}", evaluator=False))
        with_eval.append(launch_once(root, f"startup-eval-{i}", evaluator=True))
    firsts = Stat.of([run.first_update for run in plain])
    roles = [
        Comparison(
            "startup",
            f"{name} up (sockets bound/connected), after launch",
            "s",
            Stat.of([run.roles_up[name] for run in with_eval if name in run.roles_up] or [float("nan")]),
            None,
            higher_is_better=False,
            notes=_up_note(name, with_eval),
            extra={"process_started_s": _median_of(with_eval, name, "roles_started") or float("nan")},
        )
        for name in ("learner-0", "actor-0", "actor-1", "evaluator-0")
    ]
    return [
        Comparison(
            "startup",
            f"CartPole launch -> first update, vs the {TARGET_SECONDS:g} s target",
            "s",
            firsts,
            Stat.of([TARGET_SECONDS]),
            target=1.0,
            higher_is_better=False,
            notes="warm-up: learner.min_replay_size of the config's own",
            extra=_phases(plain),
        ),
        Comparison(
            "startup",
            "CartPole launch -> first update, with the evaluator vs without",
            "s",
            Stat.of([run.first_update for run in with_eval]),
            firsts,
            higher_is_better=False,
            notes="what the evaluator process adds",
            extra=_phases(with_eval),
        ),
        *roles,
    ]


def import_rows(settings: BenchSettings) -> list[Comparison]:
    """Each role's import time, alternated with ``import torch`` alone (the learner's and the
    evaluator's share of it), and whether the role imports torch at all."""
    times: dict[str, list[float]] = {role: [] for role in ROLE_MODULES}
    torch_alone: list[float] = []
    for _ in range(settings.repeats):
        torch_alone.append(import_seconds("torch"))
        for role, module in ROLE_MODULES.items():
            times[role].append(import_seconds(module))
    dynamo = Stat.of([import_seconds("torch._dynamo") for _ in range(settings.repeats)])
    rows = [
        Comparison(
            "startup",
            f"import {module} ({role}), vs import torch",
            "s",
            Stat.of(times[role]),
            Stat.of(torch_alone),
            higher_is_better=False,
            notes="imports torch" if imports_torch(module) else "no torch",
        )
        for role, module in ROLE_MODULES.items()
    ]
    rows.append(
        Comparison(
            "startup",
            "import torch._dynamo (with torch: what Adam would load), vs import torch",
            "s",
            dynamo,
            Stat.of(torch_alone),
            higher_is_better=False,
            notes="torch imports it for Adam; the learner defers it (never loaded)",
        )
    )
    return rows


def run(settings: BenchSettings, root: Path | None = None) -> list[Comparison]:
    """The start-up rows; launched runs go under ``root`` (a temporary directory by default)."""
    with contextlib.ExitStack() as stack:
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="zmqrl-bench-startup-")))
        return launch_rows(settings, root) + import_rows(settings)
