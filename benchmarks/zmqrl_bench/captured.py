"""Captured against eager updates, side by side in one run on the device given: what
``agent.capture`` (one CUDA graph per update, ``zmqrl.agents.capture``) buys a learner.

For each config two learners are built from the same seed, one with ``agent.capture=always`` (ours)
and one with ``agent.capture=never`` (the reference, the eager update), and timed in turn, repeat by
repeat, on the same synthetic batches (the shapes matter, not the pixels): the learner's work per
update apart from the replay draw and ingest, the new priorities read back where replay is
prioritized and the weights exported every ``learner.sync_interval`` updates, as the trainer does.
Each side gets ``capture.WARMUP_RUNS`` + 2 untimed updates first, so the capture itself is not
timed. The ratio is captured / eager updates/s; a second row per config gives each side's CPU
seconds per 1,000 updates (the host time a GPU learner still needs).

On a CPU "always" runs the graph's code without a graph: a ratio near 1 says the captured code costs a
CPU nothing. The pixel configs (Nature CNN) run on CUDA only: on a CPU an update takes seconds.

    python -m zmqrl_bench.captured --device cuda [--quick] [--config pong_dqn ...] [--json PATH]
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from zmqrl.agents import make_learner
from zmqrl.agents.capture import WARMUP_RUNS
from zmqrl.api import load_config
from zmqrl.config import Config
from zmqrl.core import LearningAgent
from zmqrl.spec import SampleSpec
from zmqrl.types import Batch, TransitionBatch
from zmqrl_bench.cnn_learner import CONFIG_DIR, spec_for, torch_threads, transition_batch
from zmqrl_bench.learner import observations, rollout_batch, rollout_spec, timed_updates
from zmqrl_bench.report import CPU_PER_UPDATES, BenchSettings, Comparison, Stat, markdown_table, write_json

# Seconds (full, quick) of a run on a CPU (the three MLP configs); the pixel ones add more on CUDA.
SECONDS = (60, 20)
# The configs measured, in table order: (config, runs on a CPU too). The pixel ones only on CUDA.
CONFIGS = (
    ("cartpole_dqn", True),
    ("pendulum_sac", True),
    ("cartpole_appo", True),
    ("pong_dqn", False),
    ("halfcheetah_sac", False),
    ("pong_appo", False),
)
# Distinct synthetic batches cycled through (one reused would sit warm in the caches).
BATCHES = 4
# Untimed updates per side before measuring: the warm-up runs, the capture, one replay.
WARMUP = WARMUP_RUNS + 2
# What stands in for HalfCheetah-v5 when MuJoCo is missing: 17 observations, 6 actions in [-1, 1].
HALFCHEETAH = SampleSpec((17,), "float32", (6,), "float32", action_low=(-1.0,) * 6, action_high=(1.0,) * 6)


def batches(cfg: Config, spec: SampleSpec, rng: np.random.Generator) -> list[Batch]:
    """``BATCHES`` synthetic batches the config's learner trains on."""
    size = cfg.agent.batch_size
    if cfg.agent.kind == "appo":
        rollout = rollout_spec(cfg, spec)
        return [rollout_batch(rollout, size // cfg.actor.rollout_length, rng) for _ in range(BATCHES)]
    if spec.num_actions is not None:
        return [transition_batch(spec, size, rng) for _ in range(BATCHES)]
    low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
    return [
        TransitionBatch(
            obs=observations(spec, size, rng),
            action=rng.uniform(low, high, (size, *spec.action_shape)).astype(np.float32),
            reward=rng.standard_normal(size).astype(np.float32),
            next_obs=observations(spec, size, rng),
            discount=np.full(size, cfg.agent.gamma, np.float32),
        )
        for _ in range(BATCHES)
    ]


def config_spec(cfg: Config) -> SampleSpec:
    """The config's env spec, or a stand-in when its package is missing (cnn_learner's for the
    pixel games, ``HALFCHEETAH`` for MuJoCo: the shapes are all the bench needs)."""
    try:
        return spec_for(cfg)[0]
    except KeyError:  # no known spaces by torso: an MLP config whose env is missing
        if cfg.env.id.startswith("HalfCheetah"):
            return HALFCHEETAH
        raise


def compare(name: str, settings: BenchSettings, device: str) -> list[Comparison]:
    """The two rows of one config on ``device``: updates/s and CPU per 1,000 updates."""
    path = CONFIG_DIR / f"{name}.yaml"
    cfg = load_config(path, [f"agent.device={device}"])
    spec = config_spec(cfg)
    data = batches(cfg, spec, np.random.default_rng(cfg.run.seed))
    agents: dict[str, LearningAgent] = {}
    for mode in ("always", "never"):
        agent_cfg = dataclasses.replace(cfg.agent, capture=mode)  # type: ignore[call-arg]
        agents[mode] = make_learner(agent_cfg, spec, seed=cfg.run.seed)
    prioritized = cfg.agent.kind != "appo" and cfg.replay.prioritized
    size = len(data[0].reward)
    importance = np.random.default_rng(1).uniform(0.1, 1.0, size).astype(np.float32) if prioritized else None
    ups: dict[str, list[float]] = {"always": [], "never": []}
    cpu: dict[str, list[float]] = {"always": [], "never": []}
    for repeat in range(settings.repeats):
        for mode in ("always", "never") if repeat % 2 == 0 else ("never", "always"):
            rate, cost = timed_updates(
                agents[mode],
                data,
                settings.seconds,
                cfg.learner.sync_interval,
                warmup=WARMUP if repeat == 0 else 0,
                importance=importance,
            )
            ups[mode].append(rate)
            if cost is not None:
                cpu[mode].append(cost)
    label = f"{name} ({cfg.agent.kind.upper()}, {getattr(agents['always'], 'device', device)})"
    notes = (
        f"synthetic batches of {size} {'env steps' if cfg.agent.kind == 'appo' else 'transitions'}, "
        f"agent.capture always vs never, alternating; weights exported every {cfg.learner.sync_interval} "
        f"update(s){', priorities read back' if prioritized else ''}; no replay draw, no ingest"
    )
    rows = [
        Comparison(
            "capture",
            f"{label}: captured vs eager updates",
            "updates/s",
            Stat.of(ups["always"]),
            Stat.of(ups["never"]),
            notes=notes,
        ),
    ]
    if cpu["always"] and cpu["never"]:
        rows.append(
            Comparison(
                "capture",
                f"{label}: learner CPU per 1,000 updates, captured vs eager",
                CPU_PER_UPDATES,
                Stat.of(cpu["always"]),
                Stat.of(cpu["never"]),
                higher_is_better=False,
                notes=notes,
            )
        )
    return rows


def run(settings: BenchSettings, names: Sequence[str] | None = None) -> list[Comparison]:
    """Rows for each config (``names``, default ``CONFIGS``) on ``settings.device`` (None: CUDA
    when there is one, else the CPU, where the pixel configs are left out)."""
    device = settings.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    chosen = names or [name for name, on_cpu in CONFIGS if on_cpu or device != "cpu"]
    rows: list[Comparison] = []
    for name in chosen:
        threads = load_config(CONFIG_DIR / f"{name}.yaml", []).learner.torch_threads
        with torch_threads(threads):  # the learner's intra-op threads, as it runs them
            rows += compare(name, settings, device)
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default=None, help="cpu, cuda or auto (default: cuda if there is one)")
    parser.add_argument("--quick", action="store_true", help="3 repeats of 1 s instead of 5 of 2 s")
    parser.add_argument("--seconds", type=float, default=None, help="length of one measurement")
    parser.add_argument("--repeats", type=int, default=None, help="measurements per side")
    parser.add_argument("--config", action="append", help="only this config (repeatable), e.g. pong_dqn")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    settings = dataclasses.replace(BenchSettings.make(args.quick), device=args.device)
    if args.seconds is not None:
        settings = dataclasses.replace(settings, seconds=args.seconds)
    if args.repeats is not None:
        settings = dataclasses.replace(settings, repeats=args.repeats)
    rows = run(settings, args.config)
    print(markdown_table(rows))
    if args.json is not None:
        write_json(args.json, rows, {"part": "capture", "device": settings.device or "default"})


if __name__ == "__main__":
    main()
