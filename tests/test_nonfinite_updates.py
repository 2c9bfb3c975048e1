"""No non-finite parameter is ever published or saved (issue 23 item 2).

An update whose loss or gradients hold NaN or infinity is skipped whole (no optimiser step, no
target update) and said to be; the learner counts those, gives up (exit 1) after a run of them
keeping the last finite checkpoint as ``latest``, and refuses to publish or checkpoint weights
that hold a non-finite value whoever made them.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import zmq

from tests import run_state
from tests.conftest import REPO, tiny_config, tiny_overrides
from zmqrl.agents.configs import DQNConfig, SACConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.sac import SACAgent
from zmqrl.agents.updates import guarded_step, step_unless
from zmqrl.checkpoints.files import load_checkpoint
from zmqrl.learner.nonfinite import NonFiniteTraining, NonFiniteUpdates
from zmqrl.learner.trainer import Trainer
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import TransitionBatch

POISONED_KIND = "tests.plugins.poisoned_dqn:PLUGIN"


def batch(n: int = 32, obs_dim: int = 4, action_dim: int | None = None, **columns: float) -> TransitionBatch:
    rng = np.random.default_rng(0)
    obs = rng.uniform(-0.2, 0.2, (n, obs_dim)).astype(np.float32)
    action = (
        rng.integers(0, 2, n)
        if action_dim is None
        else rng.uniform(-1, 1, (n, action_dim)).astype(np.float32)
    )
    out = TransitionBatch(obs, action, np.ones(n, np.float32), obs.copy(), np.full(n, 0.99, np.float32))
    for name, value in columns.items():
        column = getattr(out, name).copy()
        column[3] = value
        out = out._replace(**{name: column})
    return out


def tensors(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def all_finite(module: torch.nn.Module) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in module.state_dict().values())


def dqn() -> DQNAgent:
    spec = SampleSpec((4,), "float32", (), "int64", num_actions=2)
    agent = DQNAgent(DQNConfig(hidden_sizes=(16, 16), target_update_interval=1), spec, seed=0)
    agent.update(batch())  # optimiser state exists: a skip must leave it as it is too
    return agent


@pytest.mark.parametrize(("column", "value"), [("reward", np.nan), ("reward", np.inf), ("obs", 1e30)])
def test_a_dqn_update_that_is_not_finite_changes_nothing_and_says_so(column: str, value: float) -> None:
    """A NaN reward gives a NaN loss; an observation of 1e30 overflows the network (the issue's
    DQN scenario: one such row turned every parameter NaN). Validation refuses both on the wire;
    the agent must survive them anyway (an overflow can come from the network itself)."""
    agent = dqn()
    online, target = tensors(agent.online), tensors(agent.target)
    optimiser = copy.deepcopy(agent.optimizer.state_dict())
    updates = agent.updates
    metrics = agent.update(batch(**{column: value}))
    assert metrics.skipped
    assert same(tensors(agent.online), online) and same(tensors(agent.target), target)
    assert agent.updates == updates
    after = agent.optimizer.state_dict()["state"]
    assert all(torch.equal(after[i]["step"], optimiser["state"][i]["step"]) for i in after)
    assert not agent.update(batch()).skipped and not same(tensors(agent.online), online)


def sac() -> SACAgent:
    config = SACConfig(hidden_sizes=(16, 16))
    spec = SampleSpec((3,), "float32", (1,), "float32", action_low=-2.0, action_high=2.0)
    return SACAgent(config, spec, seed=0)


def test_a_sac_update_on_a_1e30_observation_leaves_every_parameter_finite() -> None:
    """The issue's SAC scenario: one update turned every policy and critic parameter NaN."""
    agent = sac()
    nets = (agent.policy, agent.critic, agent.critic_target)
    before = [tensors(net) for net in nets]
    log_alpha = agent.log_alpha.detach().clone()
    metrics = agent.update(batch(obs_dim=3, action_dim=1, obs=1e30))
    assert metrics.skipped and all(all_finite(net) for net in nets)
    assert all(same(tensors(net), was) for net, was in zip(nets, before, strict=True))
    assert torch.equal(agent.log_alpha.detach(), log_alpha) and agent.updates == 0
    assert not agent.update(batch(obs_dim=3, action_dim=1)).skipped and agent.updates == 1


def test_a_sac_update_with_a_nan_reward_moves_neither_critic_nor_targets() -> None:
    agent = sac()
    agent.update(batch(obs_dim=3, action_dim=1))
    critic, target = tensors(agent.critic), tensors(agent.critic_target)
    assert agent.update(batch(obs_dim=3, action_dim=1, reward=np.nan)).skipped
    assert same(tensors(agent.critic), critic) and same(tensors(agent.critic_target), target)
    assert all_finite(agent.policy)


def test_an_optimiser_without_the_fused_kernel_skips_too() -> None:
    layer = torch.nn.Linear(3, 2)
    optimiser = torch.optim.Adam(layer.parameters(), lr=0.1, fused=False)
    before = tensors(layer)
    loss = layer(torch.full((4, 3), float("nan"))).sum()
    loss.backward()
    found, _ = guarded_step(optimiser, loss, list(layer.parameters()))
    assert found and same(tensors(layer), before)


@pytest.mark.parametrize("found", [1.0, 0.0])
def test_a_fused_optimiser_given_the_flag_as_a_tensor_skips_on_the_device(found: float) -> None:
    """The accelerator path (the flag stays a tensor and fused Adam reads it as ``found_inf``),
    run on the CPU, where torch has a fused Adam too: a set flag writes nothing and puts the step
    count back; a clear one steps."""
    layer = torch.nn.Linear(3, 2)
    optimiser = torch.optim.Adam(layer.parameters(), lr=0.1, fused=True)
    before = tensors(layer)
    layer(torch.ones(4, 3)).sum().backward()
    step_unless(optimiser, torch.tensor(found))
    steps = {float(state["step"]) for state in optimiser.state.values()}
    if found:
        assert same(tensors(layer), before) and steps == {0.0}
    else:
        assert not same(tensors(layer), before) and steps == {1.0}
    assert not hasattr(optimiser, "found_inf"), "the flag is handed to one step only"


def test_a_run_of_skipped_updates_gives_up_and_a_finite_one_resets_it() -> None:
    clock = iter(range(1000))
    guard = NonFiniteUpdates(3, clock=lambda: float(next(clock)))
    for skipped in (True, True, False, True, True):
        guard.record(skipped, 1)
    assert (guard.total, guard.in_a_row) == (4, 2)
    with pytest.raises(NonFiniteTraining, match=r"3 updates in a row.*learner\.max_nonfinite_updates 3"):
        guard.record(True, 7)


def test_the_trainer_never_publishes_nor_checkpoints_nonfinite_weights(tmp_path: Path) -> None:
    """The last guard, whatever the agent (a plugin's update may not check)."""
    published: list[int] = []
    trainer = Trainer(tiny_config(tmp_path), tmp_path / "run")
    try:
        published.append(trainer.publish().weights.version)
        trainer.checkpoints.save_latest(final=True)
        agent = trainer.agent
        assert isinstance(agent, DQNAgent)
        with torch.no_grad():
            agent.online.head.bias[0] = float("nan")
        trainer.numbering.changed()
        with pytest.raises(NonFiniteTraining, match="refused to publish"):
            published.append(trainer.publish().weights.version)
        with pytest.raises(NonFiniteTraining, match="refused to checkpoint"):
            trainer.save_latest(final=True)
        with pytest.raises(NonFiniteTraining, match="refused to checkpoint"):
            trainer.save_best()
        assert published == [1] and trainer.end_stats("failed")["failure"].startswith("refused to publish")
        saved = load_checkpoint(trainer.checkpoints.directory / "latest")["agent"]["online"]
        assert all(bool(torch.isfinite(t).all()) for t in saved.values())
    finally:
        trainer.close()


def test_a_row_whose_td_error_is_not_finite_gets_priority_zero_not_an_error(tmp_path: Path) -> None:
    """What broke an update is rarely drawn again: the trainer hands replay 0 for a row whose
    TD error came back NaN or infinite (replay refuses non-finite priorities, which would end
    the learner), the other rows their own."""
    trainer = Trainer(tiny_config(tmp_path, replay__prioritized="true"), tmp_path / "run")
    try:
        trainer.replay.add(batch(64))
        real_update = trainer.agent.update
        given: list[np.ndarray] = []

        def poisoned(drawn: TransitionBatch, importance: np.ndarray | None) -> Any:
            result = real_update(drawn, importance)
            td = np.array(result.td_errors, np.float32)
            td[:3] = [np.nan, np.inf, -np.inf]
            return SimpleNamespace(td_errors=td, skipped=True, metrics=result.metrics)

        trainer.agent.update = poisoned  # type: ignore[method-assign]
        real_priorities = trainer.replay.update_priorities

        def recorded(ids: np.ndarray | None, td: np.ndarray) -> None:
            given.append(td)
            real_priorities(ids, td)

        trainer.replay.update_priorities = recorded  # type: ignore[method-assign]
        trainer.train_step()
        assert len(given) == 1 and np.isfinite(given[0]).all()
        assert list(given[0][:3]) == [0.0, 0.0, 0.0] and (given[0][3:] > 0).all()
        assert trainer.nonfinite.total == 1  # the skip is counted as every skip is
    finally:
        trainer.close()


def test_a_learner_whose_updates_stay_nonfinite_exits_1_keeping_a_finite_checkpoint(run_root: Path) -> None:
    """A real `zmqrl learner` fed by a raw PUSH peer, with a DQN whose TD targets turn NaN after
    40 updates (a test plugin): the learner skips those updates, gives up after
    learner.max_nonfinite_updates of them in a row, exits 1 saying why in its log and its final
    stats, and its newest checkpoint holds finite weights."""
    run_dir = run_root / "poisoned"
    config = run_root / "poisoned.yaml"
    run_root.mkdir(parents=True, exist_ok=True)
    config.write_text(f"agent:\n  kind: {POISONED_KIND}\n")
    overrides = tiny_overrides(
        run_root,
        run__name="poisoned",
        learner__max_nonfinite_updates=20,
        learner__checkpoint_interval=20,
        learner__max_updates=100_000,
        learner__min_replay_size=64,
    )
    cmd = [sys.executable, "-m", "zmqrl", "learner", str(config)]
    for item in overrides:
        cmd += ["--set", item]
    err = run_root / "learner.err"
    health = run_root / "learner-health.json"
    with err.open("w") as stderr:
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=run_state.with_health_file(health),
        )
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.linger = 0
    try:
        push.connect(run_state.wait_for_endpoints(health, 60, proc)["samples"])
        seq = 0
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if push.poll(50, zmq.POLLOUT):
                push.send_multipart(wire.dump(SamplesMsg(0, seq, 0, batch(64), [])), zmq.NOBLOCK)
                seq += 1
        proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        push.close(0)
        ctx.term()
    log = err.read_text()
    assert proc.returncode == 1, log[-3000:]
    assert "gave up after 20 updates in a row whose loss or gradients were NaN" in log
    stats: dict[str, Any] = json.loads((run_dir / "learner-stats.json").read_text())
    assert stats["state"] == "failed" and "learner.max_nonfinite_updates" in stats["failure"]
    assert stats["nonfinite_updates"] == 20 and stats["updates"] >= 60
    latest = load_checkpoint(run_dir / "checkpoints" / "latest")
    assert latest["counters"]["updates"] >= 40
    assert all(bool(torch.isfinite(t).all()) for t in latest["agent"]["online"].values())
