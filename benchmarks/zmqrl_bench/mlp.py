"""The small MLP learner on the device against one CPU core: whether a GPU pays for CartPole DQN.

The issue it answers: on an H200 a CartPole DQN update ran slower than on one core of its host
(149 vs 365 updates/s), because each of the update's few hundred torch operations is dispatched
from Python and launched on its own. So this part times configs/cartpole_dqn.yaml's learner update
(its MLP, batch, optimiser and prioritized replay's importance weights and priorities read back,
weights exported every learner.sync_interval updates: :func:`zmqrl_bench.cnn_learner.off_policy`)
on ``--device`` and on the CPU with the learner's own thread count (learner.torch_threads, one
core), alternating repeat by repeat within each (the device's rows, then the CPU's). The device row
stands beside the CPU row with a target of 1x: a GPU learner must make at least the updates/s of
the core it would otherwise run on. Without ``--device`` (or where it resolves to the CPU) there is
one CPU row and nothing to compare.
"""

from __future__ import annotations

import dataclasses

import torch

from zmqrl.api import load_config
from zmqrl_bench import cnn_learner
from zmqrl_bench.actor import CARTPOLE
from zmqrl_bench.report import BenchSettings, Comparison

SECONDS = (40, 10)
# A device's updates/s at least the CPU core's.
TARGET = 1.0


def on_gpu(device: str | None) -> bool:
    """Whether ``device`` (``--device``) puts the learner on a GPU here."""
    return device == "cuda" or (device == "auto" and torch.cuda.is_available())


def run(settings: BenchSettings) -> list[Comparison]:
    cfg = load_config(CARTPOLE, [])
    with cnn_learner.torch_threads(cfg.learner.torch_threads):
        cpu = cnn_learner.off_policy(cfg, "cartpole_dqn", settings, "cpu")
        if not on_gpu(settings.device):
            return [dataclasses.replace(row, group="mlp") for row in cpu]
        gpu = cnn_learner.off_policy(cfg, "cartpole_dqn", settings, settings.device)
    rows = [dataclasses.replace(row, group="mlp") for row in cpu]
    for row in gpu:
        beside = next((c for c in cpu if c.unit == row.unit), None)
        updates = row.unit == "updates/s"
        rows.append(
            dataclasses.replace(
                row,
                group="mlp",
                reference=beside.ours if beside is not None else None,
                target=TARGET if updates else None,
                notes=row.notes + "; beside the same update on one CPU core",
            )
        )
    return rows
