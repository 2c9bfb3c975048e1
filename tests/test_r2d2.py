"""R2D2 (agent.kind r2d2): the actor's windows, the learner's burn-in and targets, each against a
loop-by-loop reference; numpy acting against torch; the sequence replay; serial and launched runs.
The wire's sequences kind is tests/test_wire_sequences.py's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import zmqrl
from tests.test_metrics_tags import assert_documented
from zmqrl.actor.adders import Adder
from zmqrl.actor.sequences import SequenceLog
from zmqrl.agents.losses import r2d2_loss
from zmqrl.agents.r2d2 import R2D2Agent, unroll
from zmqrl.agents.r2d2_config import R2D2Config
from zmqrl.agents.r2d2_policy import NumpyR2D2Policy
from zmqrl.core import is_recurrent
from zmqrl.spec import SampleSpec
from zmqrl.types import SequenceBatch

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
OBS = 2
CORE = 4


def window_spec(length: int, burn_in: int, core: int = CORE, n_actions: int = 3) -> SampleSpec:
    return SampleSpec(
        (OBS,),
        "float32",
        (),
        "int64",
        num_actions=n_actions,
        sequence_length=burn_in + length,
        burn_in=burn_in,
        core_size=core,
        obs_low=-100.0,
        obs_high=100.0,
    )


# --------------------------------------------------------------------------------------------
# The actor's windows
# --------------------------------------------------------------------------------------------


def reference_windows(
    obs: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    states: np.ndarray,
    terminated: bool,
    length: int,
    burn_in: int,
) -> list[tuple[np.ndarray, ...]]:
    """An episode of n steps (obs: n + 1 rows, the last the final one) as the issue describes its
    windows, position by position: window k covers steps k T - B .. k T + T - 1 while k T < n."""
    n, window = len(actions), burn_in + length
    out = []
    k = 0
    while k * length < n:
        start = k * length - burn_in
        w_obs = np.stack([obs[min(max(start + p, 0), n)] for p in range(window + 1)])
        w_act, w_rew = np.zeros(window, np.int64), np.zeros(window, np.float32)
        w_term, w_mask = np.zeros(window, bool), np.zeros(window, np.uint8)
        for p in range(window):
            step = start + p
            if 0 <= step < n:
                w_act[p], w_rew[p] = actions[step], rewards[step]
                w_mask[p] = 1 if p < burn_in else 2
                w_term[p] = terminated and step == n - 1
        out.append((w_obs, w_act, w_rew, w_term, w_mask, states[max(start, 0)]))
        k += 1
    return out


@pytest.mark.parametrize(("length", "burn_in"), [(4, 2), (3, 0), (2, 5)])
def test_the_sequence_log_cuts_episodes_as_the_loop_by_loop_reference(length: int, burn_in: int) -> None:
    rng = np.random.default_rng(0)
    spec = window_spec(length, burn_in)
    log = SequenceLog(spec, num_envs=2, length=length, burn_in=burn_in, rows=1)
    # Two envs with episodes of different lengths and ends, interleaved step by step.
    episodes = {0: [(11, True), (3, False)], 1: [(1, True), (8, False), (5, True)]}
    expected: dict[int, list[tuple[np.ndarray, ...]]] = {0: [], 1: []}
    streams = {}
    for env, eps in episodes.items():
        stream = []
        for n, term in eps:
            obs = rng.normal(size=(n + 1, OBS)).astype(np.float32)
            actions = rng.integers(3, size=n)
            rewards = rng.normal(size=n).astype(np.float32)
            states = rng.uniform(-1, 1, size=(n, 2, CORE)).astype(np.float32)
            states[0] = 0.0  # an episode starts from a zero state
            expected[env] += reference_windows(obs, actions, rewards, states, term, length, burn_in)
            stream.append((obs, actions, rewards, states, term))
        streams[env] = stream
    got: list[tuple[int, SequenceBatch]] = []
    cursors = {env: [0, 0] for env in streams}  # episode, step
    for env in streams:
        log.start(env, streams[env][0][0][0])
    while any(c[0] < len(streams[e]) for e, c in cursors.items()):
        for env, cursor in cursors.items():
            if cursor[0] >= len(streams[env]):
                continue
            obs, actions, rewards, states, term = streams[env][cursor[0]]
            t = cursor[1]
            ended = t == len(actions) - 1
            log.add(env, actions[t], rewards[t], term and ended, obs[t + 1], states[t], 7, ended)
            while log.ready:
                got.append((env, log.take()[0]))
            cursor[1] += 1
            if ended:
                cursor[0], cursor[1] = cursor[0] + 1, 0
                if cursor[0] < len(streams[env]):
                    log.start(env, streams[env][cursor[0]][0][0])
    for env in streams:
        rows = [batch for e, batch in got if e == env]
        assert len(rows) == len(expected[env])
        for batch, want in zip(rows, expected[env], strict=True):
            for column, value in zip(batch, want, strict=True):
                np.testing.assert_array_equal(column[0], value)
            assert batch.size == int((want[4] == 2).sum())
    # Every step of every episode is learned from in exactly one window.
    total_steps = sum(n for eps in episodes.values() for n, _ in eps)
    assert sum(batch.size for _, batch in got) == total_steps


# --------------------------------------------------------------------------------------------
# The learner: burn-in and targets against a loop-by-loop reference
# --------------------------------------------------------------------------------------------


def random_windows(rows: int, length: int, burn_in: int, seed: int = 0) -> SequenceBatch:
    """Windows as an actor makes them: some start an episode (front padding), some end one
    (terminated or cut), each with a learned step."""
    rng = np.random.default_rng(seed)
    window = burn_in + length
    obs = rng.normal(size=(rows, window + 1, OBS)).astype(np.float32)
    action = rng.integers(3, size=(rows, window))
    reward = rng.normal(size=(rows, window)).astype(np.float32)
    terminated = np.zeros((rows, window), bool)
    mask = np.zeros((rows, window), np.uint8)
    for r in range(rows):
        first = burn_in if r % 3 == 0 else 0  # an episode's first window: padding before it
        last = window - (r % 4) * 2 if r % 2 else window  # some end the episode early
        last = max(last, burn_in + 1)
        mask[r, first:last] = 1
        mask[r, max(first, burn_in) : last] = 2
        terminated[r, last - 1] = r % 4 == 1
        action[r, mask[r] == 0] = 0
        reward[r, mask[r] == 0] = 0.0
    state = rng.uniform(-0.5, 0.5, size=(rows, 2, CORE)).astype(np.float32)
    state[::3] = 0.0
    return SequenceBatch(obs, action, reward, terminated, mask, state)


def reference_loss(agent: R2D2Agent, batch: SequenceBatch) -> tuple[float, np.ndarray]:
    """The loss and priorities by plain loops: each window stepped position by position from its
    state (holding it on padding), then each learned step's n-step double-Q target summed step by
    step."""
    cfg = agent.config
    burn_in, n, gamma = cfg.burn_in, cfg.n_step, cfg.gamma
    window = batch.mask.shape[1]

    def q_rows(net: torch.nn.Module, r: int) -> np.ndarray:
        h = torch.tensor(batch.core_state[r, 0])[None]
        c = torch.tensor(batch.core_state[r, 1])[None]
        out = []
        with torch.no_grad():
            for t in range(window + 1):
                x = net.torso(torch.tensor(batch.obs[r, t])[None])
                h_new, c_new = net.core(x, (h, c))
                out.append(net.head(h_new)[0].numpy())
                if t < window and batch.mask[r, t] > 0:
                    h, c = h_new, c_new
        return np.array(out)

    losses, priorities = [], []
    for r in range(batch.rows):
        q, q_target = q_rows(agent.online, r), q_rows(agent.target, r)
        tds = []
        for t in range(burn_in, window):
            if batch.mask[r, t] == 0:
                continue
            ret, k, done = 0.0, 0, False
            while k < n and t + k < window and batch.mask[r, t + k] > 0 and not done:
                ret += gamma**k * batch.reward[r, t + k]
                done = bool(batch.terminated[r, t + k])
                k += 1
            boot = 0.0 if done else gamma**k * q_target[t + k, q[t + k].argmax()]
            td = ret + boot - q[t, batch.action[r, t]]
            tds.append(td)
        tds_a = np.abs(np.array(tds))
        losses.extend(np.where(tds_a <= 1.0, 0.5 * tds_a**2, tds_a - 0.5))
        priorities.append(0.9 * tds_a.max() + 0.1 * tds_a.mean())
    return float(np.mean(losses)), np.array(priorities)


def test_burn_in_and_targets_equal_the_loop_by_loop_reference() -> None:
    cfg = R2D2Config(hidden_sizes=[8], core_size=CORE, sequence_length=6, burn_in=3, n_step=3, device="cpu")
    spec = window_spec(6, 3)
    agent = R2D2Agent(cfg, spec, seed=1)
    with torch.no_grad():  # a target net of its own, so double Q's argmax and value differ
        for p in agent.target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    batch = random_windows(9, 6, 3)
    want_loss, want_priorities = reference_loss(agent, batch)
    x = {name: torch.as_tensor(np.asarray(col)) for name, col in batch._asdict().items()}
    advance = x["mask"] > 0
    q = unroll(agent.online, x["obs"], x["core_state"], advance, 3)
    target_q = unroll(agent.target, x["obs"], x["core_state"], advance, 3)
    out = r2d2_loss(
        q,
        target_q,
        q.detach(),
        x["action"][:, 3:],
        x["reward"][:, 3:],
        x["terminated"][:, 3:],
        advance[:, 3:],
        cfg.gamma,
        cfg.n_step,
        cfg.priority_eta,
        cfg.huber_delta,
    )
    assert out.loss.item() == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(out.priorities.numpy(), want_priorities, rtol=1e-5)
    # The update reports the same priorities, and its burn-in takes no gradient.
    result = agent.update(batch)
    np.testing.assert_allclose(result.td_errors, want_priorities, rtol=1e-5)
    assert not result.skipped and agent.updates == 1


def test_no_gradient_flows_through_the_burn_in() -> None:
    cfg = R2D2Config(hidden_sizes=[8], core_size=CORE, sequence_length=4, burn_in=4, device="cpu")
    agent = R2D2Agent(cfg, window_spec(4, 4), seed=0)
    batch = random_windows(3, 4, 4)
    obs = torch.as_tensor(batch.obs).requires_grad_(True)
    q = unroll(agent.online, obs, torch.as_tensor(batch.core_state), torch.as_tensor(batch.mask) > 0, 4)
    q.sum().backward()
    assert obs.grad is not None
    assert float(obs.grad[:, :4].abs().sum()) == 0.0 and float(obs.grad[:, 4:].abs().sum()) > 0.0


def test_a_non_finite_batch_skips_the_update() -> None:
    cfg = R2D2Config(hidden_sizes=[8], core_size=CORE, sequence_length=4, burn_in=2, device="cpu")
    agent = R2D2Agent(cfg, window_spec(4, 2), seed=0)
    before = {k: v.clone() for k, v in agent.online.state_dict().items()}
    batch = random_windows(3, 4, 2)
    batch.reward[0, 3] = np.nan
    result = agent.update(batch)
    assert result.skipped and agent.updates == 0
    for name, value in agent.online.state_dict().items():
        assert torch.equal(value, before[name])


# --------------------------------------------------------------------------------------------
# Acting: numpy equals torch, the state carried and reset at episode starts
# --------------------------------------------------------------------------------------------


def test_numpy_acting_equals_torch_with_the_state_carried_and_reset() -> None:
    cfg = R2D2Config(hidden_sizes=[16], core_size=8, device="cpu")
    spec = window_spec(cfg.sequence_length, cfg.burn_in, core=8, n_actions=3)
    agent = R2D2Agent(cfg, spec, seed=3)
    policy = NumpyR2D2Policy(cfg, spec, seed=9)
    policy.load_weights(agent.export_weights())
    assert is_recurrent(policy) and is_recurrent(agent)
    rng = np.random.default_rng(0)
    for step in range(12):
        obs = rng.normal(size=(3, OBS)).astype(np.float32)
        np.testing.assert_allclose(policy.q_values(obs), agent.q_values(obs), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(policy.core_state(), agent.core_state(), rtol=1e-5, atol=1e-6)
        if step in (4, 9):  # env 1's episode ends: its state starts over, the others' go on
            done = np.array([False, True, False])
            policy.reset_core(done)
            agent.reset_core(done)
            assert not policy.core_state()[1].any() and policy.core_state()[0].any()
    # A state that is carried changes the values: the same observation twice differs.
    policy.reset_core()
    obs = rng.normal(size=(1, OBS)).astype(np.float32)
    assert not np.allclose(policy.q_values(obs), policy.q_values(obs))


# --------------------------------------------------------------------------------------------
# Runs
# --------------------------------------------------------------------------------------------


def r2d2_config(run_root: Path, *extra: str) -> zmqrl.Config:
    return zmqrl.load_config(
        CONFIGS / "cartpole_novel_r2d2.yaml",
        [
            f"run.dir={run_root}",
            "learner.max_updates=30",
            "learner.min_replay_size=8",
            "learner.eval_interval=30",
            "learner.eval_episodes=2",
            "learner.checkpoint_interval=30",
            "learner.republish_seconds=0.2",
            "learner.log_interval=10",
            "actor.max_steps_per_s=3000",
            *extra,
        ],
    )


def test_a_serial_r2d2_run_trains_resumes_and_its_policy_keeps_state(run_root: Path) -> None:
    import gymnasium as gym

    from zmqrl.envs.masked import CARTPOLE_NO_VELOCITY, register_own_ids

    result = zmqrl.train(r2d2_config(run_root), mode="serial")
    assert result.state == "finished" and result.learner["updates"] == 30
    assert result.actors[0]["weights_version"] >= 2
    stats = json.loads((result.run_dir / "stats.json").read_text())
    assert stats["learner"]["bad_messages"] == 0
    assert "losses/td_abs_mean" in assert_documented(result.run_dir)  # every tag it wrote is documented
    # The checkpoint holds the replay's windows, and a resumed run restores them.
    resumed = zmqrl.train(r2d2_config(run_root, "learner.max_updates=40"), mode="serial", resume=True)
    assert resumed.state == "finished" and resumed.learner["updates"] == 40
    assert resumed.learner["replay_size"] > 0
    policy = zmqrl.load_policy(result.run_dir)
    assert policy.recurrent
    register_own_ids()
    env = gym.make(CARTPOLE_NO_VELOCITY)
    obs, _ = env.reset(seed=0)
    policy.reset()
    done = False
    while not done:
        obs, _, terminated, truncated, _ = env.step(int(policy.act(obs)))
        done = terminated or truncated
    env.close()


@pytest.mark.slow
def test_r2d2_runs_as_processes_through_the_supervisor(run_root: Path) -> None:
    cfg = r2d2_config(
        run_root,
        "learner.max_updates=40",
        "evaluator.enabled=true",
        "evaluator.episodes=2",
        "evaluator.interval_seconds=0.5",
        "transport.samples=tcp://127.0.0.1:0",
        "transport.weights=tcp://127.0.0.1:0",
        "transport.heartbeat=tcp://127.0.0.1:0",
        "transport.control=tcp://127.0.0.1:0",
        "supervisor.metrics_http=127.0.0.1:0",
    )
    result = zmqrl.train(cfg, mode="processes")
    assert result.state == "finished" and result.exit_code == 0 and result.updates == 40
    stats = json.loads((result.run_dir / "stats.json").read_text())
    learner = stats["learner"]
    assert learner["bad_messages"] == 0 and learner["samples"] > 0
    assert all(row["samples"] > 0 for row in stats["actors"]), stats["actors"]
    assert stats["evaluator"]["evaluations"] >= 1


def test_an_adder_sends_the_windows_as_sequences_messages() -> None:
    from zmqrl.transport import wire

    spec = window_spec(3, 1)
    log = SequenceLog(spec, 1, 3, 1, rows=2)
    adder = Adder(0, log)
    log.start(0, np.zeros(OBS, np.float32))
    for t in range(7):
        log.add(
            0, 1, 1.0, t == 6, np.full(OBS, t + 1, np.float32), np.zeros((2, CORE), np.float32), 0, t == 6
        )
    msg = adder.pop()
    assert msg is not None and isinstance(msg.batch, SequenceBatch)
    back = wire.load_samples(wire.dump(msg), spec)
    assert isinstance(back.batch, SequenceBatch) and back.batch.size == 6
