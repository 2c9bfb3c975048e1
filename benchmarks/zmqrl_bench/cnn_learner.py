"""A learner's updates/s on the convolutional configs, on the device given (``zmqrl bench
--device``): what a GPU machine changes. The Nature CNN on Pong-sized frames (4x84x84 uint8;
configs/pong_dqn.yaml, configs/pong_appo.yaml) and the MinAtar CNN on its 10x10 grids
(configs/minatar_breakout_dqn.yaml, configs/minatar_breakout_appo.yaml), each with its config's
network, optimiser and batch size.

The batches are synthetic (random frames within the env's bounds, built before timing): updates/s
of a network depend on the shapes, not on what the pixels show. What is timed is the learner's
work per update apart from the replay draw and ingest. DQN: ``agent.update`` on ``batch_size``
transitions, importance-weighted with the TD errors read back when replay is prioritized (the new
priorities: one device-to-host copy per update, as the trainer makes), and the weights exported
every ``learner.sync_interval`` updates (what a publish copies off the device). APPO:
:func:`zmqrl_bench.learner.on_policy`, the agent's update on rollouts of ``batch_size`` env steps,
weights exported after each as the configs publish. A row per config gives this process's CPU
seconds per 1,000 updates (all threads): what a GPU learner still asks of the host.

On a CPU an APPO update on the Nature CNN takes tens of seconds (Pong's 4096 env steps x 4
epochs, two networks), so CPU rows cap an APPO batch at CPU_APPO_STEPS env steps and say so in
their name. A config's env package (ale-py, MinAtar) is not needed: without it the known spaces
of the game stand in.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from zmqrl.agents import make_learner
from zmqrl.api import load_config
from zmqrl.config import Config
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.errors import EnvError
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch
from zmqrl_bench.learner import observations, on_policy, timed_updates
from zmqrl_bench.report import CPU_PER_UPDATES, BenchSettings, Comparison, Stat

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
# The configs measured, in table order.
CONFIGS = ("pong_dqn", "pong_appo", "minatar_breakout_dqn", "minatar_breakout_appo")
# What stands in for a config's env when its package is missing: (obs shape, obs high, actions)
# by torso. Pong's minimal action set has 6 actions; MinAtar Breakout's 3, on 4 channels of 0/1.
KNOWN_SPACES = {"nature_cnn": ((4, 84, 84), 255.0, 6), "minatar_cnn": ((4, 10, 10), 1.0, 3)}
# Most env steps in one APPO update on a CPU (full, quick runs); a GPU gets the config's batch.
CPU_APPO_STEPS = (512, 128)
# Distinct synthetic DQN batches cycled through (one reused would sit warm in the caches).
DQN_BATCHES = 4
# DQN updates before each measurement (first-call allocations, Adam's state, a GPU's kernels).
DQN_WARMUP = 5

SECONDS = (60, 25)


def spec_for(cfg: Config) -> tuple[SampleSpec, str]:
    """The spec the learner would check samples against, and where it came from: the env itself,
    or (its package missing) the game's known spaces."""
    try:
        env = make_env(cfg.env, training=False)
    except EnvError:
        shape, high, actions = KNOWN_SPACES[str(getattr(cfg.agent, "torso", ""))]
        spec = SampleSpec(
            obs_shape=shape,
            obs_dtype="uint8",
            action_shape=(),
            action_dtype="int64",
            num_actions=actions,
            obs_low=0.0,
            obs_high=high,
        )
        return spec, "the game's known spaces (env package not installed)"
    try:
        spec = sample_spec(
            env, max_abs_obs=cfg.transport.max_abs_obs, max_abs_reward=cfg.transport.max_abs_reward
        )
    finally:
        env.close()
    return spec, "the env's spaces"


def transition_batch(spec: SampleSpec, rows: int, rng: np.random.Generator) -> TransitionBatch:
    """``rows`` synthetic n-step transitions within ``spec`` (discrete actions)."""
    if spec.num_actions is None:
        raise ValueError("the CNN configs have discrete actions")
    return TransitionBatch(
        obs=observations(spec, rows, rng),
        action=rng.integers(0, spec.num_actions, size=rows, dtype=np.int64),
        reward=rng.standard_normal(rows).astype(np.float32),
        next_obs=observations(spec, rows, rng),
        discount=np.where(rng.random(rows) < 0.02, 0.0, 0.99**3).astype(np.float32),
    )


@contextlib.contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """The learner's intra-op threads (learner.torch_threads) while measuring on a CPU."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def off_policy(cfg: Config, name: str, settings: BenchSettings, device: str | None) -> list[Comparison]:
    """The DQN row of one config: updates/s, and samples trained/s and CPU cost in ``extra``."""
    spec, source = spec_for(cfg)
    agent = make_learner(cfg.agent, spec, seed=cfg.run.seed, device=device)
    batch_size = cfg.agent.batch_size
    rng = np.random.default_rng(cfg.run.seed)
    batches = [transition_batch(spec, batch_size, rng) for _ in range(DQN_BATCHES)]
    importance = rng.uniform(0.1, 1.0, batch_size).astype(np.float32) if cfg.replay.prioritized else None
    measured = [
        timed_updates(
            agent,
            batches,
            settings.seconds,
            cfg.learner.sync_interval,
            warmup=DQN_WARMUP,
            importance=importance,
        )
        for _ in range(settings.repeats)
    ]
    ups = Stat.of([u for u, _ in measured])
    costs = [c for _, c in measured if c is not None]
    replay = "prioritized" if cfg.replay.prioritized else "uniform"
    notes = (
        f"synthetic batches of {batch_size} ({source}), {replay} replay's update, weights exported every "
        f"{cfg.learner.sync_interval} updates; no replay draw, no ingest"
    )
    extra = {"batch_size": float(batch_size), "samples_trained_per_s": ups.median * batch_size}
    label = f"{name} (DQN, {getattr(agent, 'device', 'cpu')})"
    rows = [
        Comparison(
            "scaling",
            f"{label}: update on synthetic batches of {batch_size}",
            "updates/s",
            ups,
            None,
            notes=notes,
            extra=extra,
        )
    ]
    if costs:
        rows.append(
            Comparison(
                "scaling",
                f"{label}: learner CPU per 1,000 updates",
                CPU_PER_UPDATES,
                Stat.of(costs),
                None,
                higher_is_better=False,
                notes=notes,
            )
        )
    return rows


def appo_overrides(cfg: Config, device: str | None, quick: bool) -> list[str]:
    """Overrides for an APPO row: the device, and on a CPU the batch cut to CPU_APPO_STEPS
    (whole rollouts; minibatches and the actors' envs no more than the rollouts)."""
    overrides = [] if device is None else [f"agent.device={device}"]
    resolved = device or cfg.agent.device
    on_cpu = resolved == "cpu" or (resolved == "auto" and not torch.cuda.is_available())
    cap = CPU_APPO_STEPS[1 if quick else 0]
    if on_cpu and cfg.agent.batch_size > cap:
        rows = max(1, cap // cfg.actor.rollout_length)
        overrides += [
            f"agent.batch_size={rows * cfg.actor.rollout_length}",
            f"agent.minibatches={min(getattr(cfg.agent, 'minibatches', 1), rows)}",
            f"actor.envs_per_actor={min(cfg.actor.envs_per_actor, rows)}",
        ]
    return overrides


def run(settings: BenchSettings) -> list[Comparison]:
    """Rows for every config in CONFIGS on ``settings.device`` (None: each config's own)."""
    rows: list[Comparison] = []
    for name in CONFIGS:
        path = CONFIG_DIR / f"{name}.yaml"
        cfg = load_config(path, [])
        with torch_threads(cfg.learner.torch_threads):
            if cfg.agent.kind == "dqn":
                rows += off_policy(cfg, name, settings, settings.device)
                continue
            overrides = appo_overrides(cfg, settings.device, settings.quick)
            cut = load_config(path, overrides).agent.batch_size
            appo = on_policy(path, settings, overrides, base_spec=lambda c: spec_for(c)[0])
            suffix = (
                f" (CPU: batch {cut} of the config's {cfg.agent.batch_size})"
                if cut != cfg.agent.batch_size
                else ""
            )
            rows += [dataclasses.replace(r, group="scaling", name=r.name + suffix) for r in appo]
    return rows
