"""The learner's training loop under offered load, two code trees side by side in one run.

For each offered rate (0, 20,000 and 100,000 CartPole transitions/s from two paced sender
processes, 64 rows a message, no replay ratio) and each tree, alternately, repeat by repeat, a
child process builds the learner's Trainer from that tree's code and trains for a window while
its ingest runs the way that tree runs it:

- a tree whose ``Ingest`` still has ``drain`` (before issue 38): an ingest thread in the training
  process, its budget off (``learner.ingest_max_share: null``) or on (0.05);
- a tree with ``zmqrl.learner.intake``: the intake process, and the training loop taking its
  groups between updates (``SampleFeed.take_if_due``), as the learner does.

It prints updates/s, transitions/s taken, the training process's CPU seconds per 1,000 updates and
the same with the intake process's CPU added, per tree and rate, and each tree's ratios to its
own idle figures (rate 0). Run from the repository root:

    python benchmarks/ingest_ab.py --before /tmp/wt-before --after . [--seconds 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

from zmqrl_bench.senders import SampleShape, Senders

RATES = (0, 20_000, 100_000)
SENDERS = 2

CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
import torch
from zmqrl.api import load_config
from zmqrl_bench.cpu import per_thousand, process_cpu_seconds
from zmqrl_bench.senders import SampleShape, sample_batch
from zmqrl.learner.trainer import Trainer
from zmqrl.transport.messages import SamplesMsg

seconds, budget = float(sys.argv[1]), sys.argv[2]
torch.set_num_threads(1)
overrides = ["learner.eval_interval=0", "learner.checkpoint_interval=0", "learner.log_interval=1000000",
             "learner.samples_per_insert=null", "replay.prioritized=false", "transport.samples=tcp://127.0.0.1:0",
             f"learner.ingest_max_share={budget}"]
cfg = load_config(Path("configs/cartpole_dqn.yaml"), overrides)
tmp = tempfile.mkdtemp()
trainer = Trainer(cfg, Path(tmp), background_checkpoints=False)
batch = sample_batch(SampleShape(batch=64), seed=99)
for seq in range(100):
    trainer.ingest.accept(SamplesMsg(999, seq, 0, batch, episodes=[]))
import zmq
ctx = zmq.Context()
intake_pid = None
if hasattr(trainer.ingest, "drain"):  # before: an ingest thread in this process
    import threading
    from zmqrl.runtime.link import socket_limits
    from zmqrl.transport import sockets
    from zmqrl.transport.channels import BadMessages, SampleReceiver
    sock, endpoint = sockets.samples_pull(ctx, "tcp://127.0.0.1:0", socket_limits(cfg))
    receiver = SampleReceiver(sock, trainer.spec, BadMessages("samples"))
    stop = threading.Event()
    thread = threading.Thread(target=trainer.ingest.drain, args=(receiver, stop), daemon=True)
    take = lambda: None
else:  # after: the intake process, groups taken between updates
    from zmqrl.learner.ingest import group_limit
    from zmqrl.learner.intake import IntakeProcess, SampleFeed
    from zmqrl.transport.channels import BadMessages
    intake = IntakeProcess(ctx, cfg.transport, BadMessages("samples"))
    endpoint = intake.bound()
    intake.begin(trainer.spec, 2, group_limit(trainer.spec, trainer.limiter))
    feed = SampleFeed(intake, trainer.ingest)
    take = feed.take_if_due
    intake_pid = intake.proc.pid
    thread = None
print(json.dumps({"endpoint": endpoint}), flush=True)
sys.stdin.readline()  # the senders are up (the parent's: the same paced senders for every tree)
if thread: thread.start()
deadline = time.monotonic() + 1.0  # warm up: caches, the first groups
while time.monotonic() < deadline:
    take(); trainer.train_step()
c0, i0 = time.process_time(), (process_cpu_seconds(intake_pid) or 0.0) if intake_pid else 0.0
s0, u0, t0 = trainer.counters.samples, trainer.counters.updates, time.perf_counter()
while time.perf_counter() - t0 < seconds:
    take(); trainer.train_step()
elapsed = time.perf_counter() - t0
updates = trainer.counters.updates - u0
cpu = time.process_time() - c0
intake_cpu = ((process_cpu_seconds(intake_pid) or 0.0) - i0) if intake_pid else 0.0
print(json.dumps({"updates_per_s": updates / elapsed, "taken_per_s": (trainer.counters.samples - s0) / elapsed,
                  "cpu_per_1k": per_thousand(cpu, updates), "with_intake_per_1k": per_thousand(cpu + intake_cpu, updates)}))
if thread: stop.set(); thread.join(5)
else: intake.close()
sys.stdout.flush()
import os; os._exit(0)
"""


def measure(tree: Path, rate: int, seconds: float, budget: str) -> dict[str, float]:
    """One window of ``tree``'s learner with this process's senders offering ``rate``."""
    # The tree's zmqrl under test; the measuring helpers (zmqrl_bench) are this script's, beside it.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree.resolve()), str(Path(__file__).parent)])}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(seconds), budget],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        endpoint = json.loads(child.stdout.readline())["endpoint"]
        senders = Senders(endpoint, SENDERS, SampleShape(batch=64), rate=rate) if rate else None
        with senders if senders is not None else contextlib.nullcontext():
            child.stdin.write("go\n")
            child.stdin.flush()
            line = child.stdout.readline()
        child.wait(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    if not line:
        raise RuntimeError(f"{tree} at {rate}/s failed:\n{child.stderr.read()[-3000:] if child.stderr else ''}")
    result: dict[str, float] = json.loads(line)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code before")
    parser.add_argument("--after", type=Path, default=Path("."), help="the code after (default: here)")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of one window")
    parser.add_argument("--repeats", type=int, default=3, help="windows per tree and rate")
    parser.add_argument("--json", type=Path, default=None, help="also write every window here")
    args = parser.parse_args()
    sides = {"before, budget off": (args.before, "null"), "before, budget 0.05": (args.before, "0.05"),
             "after": (args.after, "0.05")}  # fmt: skip
    results: dict[str, dict[int, list[dict[str, float]]]] = {name: {r: [] for r in RATES} for name in sides}
    for _ in range(args.repeats):
        for rate in RATES:
            for name, (tree, budget) in sides.items():
                results[name][rate].append(measure(tree, rate, args.seconds, budget))
                print(f"{name:>20} {rate:>7,}/s: {results[name][rate][-1]}", flush=True)
    print(f"\nmedians over {args.repeats} windows of {args.seconds:g} s ({SENDERS} paced senders, CartPole, uniform)")
    print("| code | offered/s | updates/s | x idle | taken/s | CPU-s/1k upd | x idle | + intake | x idle |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in sides:
        idle = {k: median(r[k] for r in results[name][0]) for k in results[name][0][0]}
        for rate in RATES:
            m = {k: median(r[k] for r in results[name][rate]) for k in results[name][rate][0]}
            print(
                f"| {name} | {rate:,} | {m['updates_per_s']:.0f} | {m['updates_per_s'] / idle['updates_per_s']:.2f}x "
                f"| {m['taken_per_s']:,.0f} | {m['cpu_per_1k']:.3f} | {m['cpu_per_1k'] / idle['cpu_per_1k']:.2f}x "
                f"| {m['with_intake_per_1k']:.3f} | {m['with_intake_per_1k'] / idle['with_intake_per_1k']:.2f}x |"
            )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    with tempfile.TemporaryDirectory():
        main()
