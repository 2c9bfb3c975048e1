"""Captured updates (agent.capture, zmqrl.agents.capture): the code a CUDA graph records gives the
eager update's numbers, skips what it skips, and keeps its checkpoints.

There is no GPU here: ``capture: always`` on a CPU runs the captured code (static input buffers, skip
flags kept on the device, fused Adam skipping by ``found_inf``, learning rates in tensors, one
packed output) without a graph. Each test runs an eager agent and a captured one from the same
seed on the same batches and compares everything the learner reads and saves.
"""

from __future__ import annotations

import io
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from zmqrl.agents.appo import APPOAgent
from zmqrl.agents.capture import CapturedUpdate, capture_wanted
from zmqrl.agents.configs import APPOConfig, DQNConfig, SACConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.sac import SACAgent
from zmqrl.spec import SampleSpec
from zmqrl.types import Batch, RolloutBatch, TransitionBatch

torch.set_num_threads(1)

CARTPOLE = SampleSpec((4,), "float32", (), "int64", num_actions=2)
FRAMES = SampleSpec((4, 10, 10), "uint8", (), "int64", num_actions=3, obs_low=0, obs_high=1)
PENDULUM = SampleSpec((3,), "float32", (1,), "float32", action_low=(-2.0,), action_high=(2.0,))
BOX = SampleSpec((3,), "float32", (2,), "float32", action_low=(-1.0, -0.5), action_high=(1.0, 2.0))
# Eager and captured differ only in float rounding (a float32 lr tensor, a padded forward pass).
RTOL, ATOL = 1e-5, 1e-6

Agent = Any  # DQNAgent | SACAgent | APPOAgent: the tests use what the three share
Batches = Callable[[Agent, int], Batch]


def dqn_batch(spec: SampleSpec) -> Batches:
    def make(agent: Agent, i: int) -> TransitionBatch:
        rng = np.random.default_rng(i)
        n = 32
        high = int(np.max(spec.obs_high or 0)) + 1
        obs, next_obs = (
            rng.integers(0, high, (n, *spec.obs_shape), dtype=np.uint8)
            if spec.obs_dtype == "uint8"
            else rng.normal(size=(n, *spec.obs_shape)).astype(np.float32)
            for _ in range(2)
        )
        actions = rng.integers(0, spec.num_actions or 1, n)
        discount = np.where(rng.random(n) < 0.1, 0.0, 0.97).astype(np.float32)
        return TransitionBatch(obs, actions, rng.normal(size=n).astype(np.float32), next_obs, discount)

    return make


def sac_batch(agent: Agent, i: int) -> TransitionBatch:
    rng = np.random.default_rng(i)
    n = 32
    return TransitionBatch(
        rng.normal(size=(n, 3)).astype(np.float32),
        rng.uniform(-2, 2, (n, 1)).astype(np.float32),
        rng.normal(size=n).astype(np.float32),
        rng.normal(size=(n, 3)).astype(np.float32),
        np.full(n, 0.99, np.float32),
    )


def appo_batch(spec: SampleSpec) -> Batches:
    def make(agent: Agent, i: int) -> RolloutBatch:
        """Random actions with the agent's log-probabilities (its acting RNG untouched), with
        terminations and truncations (several per row in some batches: the captured update's
        final_obs capacity grows)."""
        rng = np.random.default_rng(i)
        rows, steps = 4, 6
        obs = rng.normal(size=(rows, steps + 1, *spec.obs_shape)).astype(np.float32)
        if spec.num_actions is not None:
            actions = rng.integers(0, spec.num_actions, rows * steps)
        else:
            low, high = np.asarray(spec.action_low), np.asarray(spec.action_high)
            actions = rng.uniform(low, high, (rows * steps, 2)).astype(np.float32)
        with torch.no_grad():
            flat = torch.from_numpy(obs[:, :steps].reshape(rows * steps, *spec.obs_shape))
            logp = agent.policy.log_prob_entropy(flat, torch.from_numpy(actions))[0].numpy()
        truncated = rng.random((rows, steps)) < (0.4 if i % 3 == 2 else 0.1)
        terminated = (rng.random((rows, steps)) < 0.15) & ~truncated
        return RolloutBatch(
            obs=obs,
            action=actions.reshape(rows, steps, *actions.shape[1:]),
            reward=rng.normal(size=(rows, steps)).astype(np.float32),
            terminated=terminated,
            truncated=truncated,
            logp=logp.reshape(rows, steps),
            final_obs=rng.normal(size=(int(truncated.sum()), *spec.obs_shape)).astype(np.float32),
        )

    return make


def configs(config_class: type, **values: Any) -> Callable[[str], Any]:
    """The config of a case, for a capture mode."""
    return lambda capture: config_class(device="cpu", capture=capture, **values)


# (agent class, config maker, spec, batches, prioritized): every update path the agents have.
CASES = [
    pytest.param(
        DQNAgent,
        configs(DQNConfig, hidden_sizes=[16, 16], target_update_interval=3),
        CARTPOLE,
        dqn_batch(CARTPOLE),
        True,
        id="dqn-per",
    ),
    pytest.param(
        DQNAgent,
        configs(
            DQNConfig,
            hidden_sizes=[16],
            dueling=True,
            max_grad_norm=0.0,
            lr_final=1e-5,
            lr_decay_updates=5,
            tau=0.1,
            target_update_interval=1,
        ),
        CARTPOLE,
        dqn_batch(CARTPOLE),
        False,
        id="dqn-dueling-annealed-unclipped",
    ),
    pytest.param(
        DQNAgent,
        configs(DQNConfig, hidden_sizes=[16], torso="minatar_cnn", double=False),
        FRAMES,
        dqn_batch(FRAMES),
        False,
        id="dqn-minatar-cnn",
    ),
    pytest.param(
        SACAgent, configs(SACConfig, hidden_sizes=[16, 16]), PENDULUM, sac_batch, True, id="sac-per"
    ),
    pytest.param(
        SACAgent,
        configs(SACConfig, hidden_sizes=[16], autotune=False, policy_update_interval=2, max_grad_norm=1.0),
        PENDULUM,
        sac_batch,
        False,
        id="sac-delayed",
    ),
    pytest.param(
        APPOAgent,
        configs(APPOConfig, hidden_sizes=[16], epochs=2, minibatches=2, lr_final=0.0, lr_decay_updates=10),
        CARTPOLE,
        appo_batch(CARTPOLE),
        False,
        id="appo-minibatches",
    ),
    pytest.param(
        APPOAgent,
        configs(APPOConfig, hidden_sizes=[16], clip=None, max_grad_norm=0.0),
        BOX,
        appo_batch(BOX),
        False,
        id="appo-impala-box",
    ),
]
ARGS = ("agent_class", "make_config", "spec", "batches", "prioritized")
UPDATES = 6


def pair(agent_class: type, make_config: Callable[[str], Any], spec: SampleSpec) -> tuple[Agent, Agent]:
    eager = agent_class(make_config("never"), spec, seed=3)
    captured = agent_class(make_config("always"), spec, seed=3)
    assert eager._captured is None and captured._captured is not None
    return eager, captured


def importance(batch: Batch, i: int) -> np.ndarray:
    return np.random.default_rng(100 + i).uniform(0.1, 1.0, len(batch.reward)).astype(np.float32)


def tensors(state: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """Every leaf of a (nested) state dict by path: tensors, and the python values."""
    if isinstance(state, dict):
        for key, value in state.items():
            yield from tensors(value, f"{path}.{key}")
    elif isinstance(state, list | tuple):
        for i, value in enumerate(state):
            yield from tensors(value, f"{path}[{i}]")
    else:
        yield path, state


# What a skipped update still moves, on both paths as before capture: the optimisers' lr (set from
# the update count before the step), SAC's latest policy-step metrics and learning noise, APPO's
# minibatch shuffle.
MOVED_BY_A_SKIP = ("].lr", ".policy_stats", ".noise", ".shuffle.state.state", ".has_uint32", ".uinteger")


def assert_states_close(
    a: dict[str, Any], b: dict[str, Any], exact: bool = False, skip: tuple[str, ...] = ()
) -> None:
    """Same keys, shapes, dtypes and python values; tensors equal within the tolerance (or
    exactly), the paths ending with one of ``skip`` left out."""
    left, right = dict(tensors(a)), dict(tensors(b))
    assert left.keys() == right.keys()
    for name, x in left.items():
        if name.endswith(skip):
            continue
        y = right[name]
        if isinstance(x, torch.Tensor):
            assert isinstance(y, torch.Tensor) and x.shape == y.shape and x.dtype == y.dtype, name
            if exact:
                assert torch.equal(x, y), name
            else:
                torch.testing.assert_close(x, y, rtol=RTOL, atol=ATOL, msg=name)
        elif isinstance(x, float):
            assert y == pytest.approx(x, rel=RTOL), name
        else:
            assert type(x) is type(y) and x == y, name


def assert_results_close(a: Any, b: Any) -> None:
    assert a.skipped == b.skipped
    assert dict(a).keys() == dict(b).keys()
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=RTOL, atol=ATOL, err_msg=key)
    assert a.td_errors.shape == b.td_errors.shape and b.td_errors.dtype == np.float32
    np.testing.assert_allclose(b.td_errors, a.td_errors, rtol=RTOL, atol=ATOL)


def saved(agent: Agent) -> dict[str, Any]:
    """The agent's state as a checkpoint holds it (saved and read back, weights only)."""
    buffer = io.BytesIO()
    torch.save(agent.state_dict(), buffer)
    buffer.seek(0)
    state: dict[str, Any] = torch.load(buffer, weights_only=True)
    return state


@pytest.mark.parametrize(ARGS, CASES)
def test_the_captured_update_gives_the_eager_numbers(
    agent_class: type,
    make_config: Callable[[str], Any],
    spec: SampleSpec,
    batches: Batches,
    prioritized: bool,
) -> None:
    """Same seed, same batches: after each update the metrics, TD errors and skip flag agree, and
    after them all every weight, target, optimiser moment and count does; the state dicts have
    the same keys, shapes and python values (a checkpoint cannot tell the paths apart)."""
    eager, captured = pair(agent_class, make_config, spec)
    for i in range(UPDATES):
        batch = batches(eager, i)
        weights = importance(batch, i) if prioritized else None
        a, b = eager.update(batch, weights), captured.update(batch, weights)
        assert not a.skipped
        assert_results_close(a, b)
    assert captured.updates == eager.updates == UPDATES
    assert_states_close(eager.state_dict(), captured.state_dict())


@pytest.mark.parametrize(ARGS, CASES)
def test_a_nan_reward_is_skipped_and_changes_nothing_captured(
    agent_class: type,
    make_config: Callable[[str], Any],
    spec: SampleSpec,
    batches: Batches,
    prioritized: bool,
) -> None:
    """A batch with a NaN reward: both paths say skipped, and the captured agent's weights,
    targets, optimiser moments and step counts and update count are exactly as before; the
    next good batch trains both alike again (what a skip still moves moved alike)."""
    eager, captured = pair(agent_class, make_config, spec)
    for i in range(2):
        batch = batches(eager, i)
        eager.update(batch), captured.update(batch)
    bad = batches(eager, 2)
    bad.reward[(0,) * bad.reward.ndim] = np.nan
    before = saved(captured)
    a, b = eager.update(bad), captured.update(bad)
    assert a.skipped and b.skipped
    assert_states_close(before, saved(captured), exact=True, skip=MOVED_BY_A_SKIP)
    good = batches(eager, 3)
    assert_results_close(eager.update(good), captured.update(good))
    assert_states_close(eager.state_dict(), captured.state_dict())


@pytest.mark.parametrize(ARGS, CASES[::3])
def test_a_checkpoint_of_either_path_resumes_in_the_other(
    agent_class: type,
    make_config: Callable[[str], Any],
    spec: SampleSpec,
    batches: Batches,
    prioritized: bool,
) -> None:
    """Eager's checkpoint loaded into a captured agent (which had graphs of its own state to
    drop), and the captured one's into an eager agent: both go on as the run they came from."""
    eager, captured = pair(agent_class, make_config, spec)
    for i in range(3):
        batch = batches(eager, i)
        eager.update(batch), captured.update(batch)
    resumed_captured, resumed_eager = pair(agent_class, make_config, spec)
    resumed_captured.update(batches(eager, 9))  # its own graphs and optimiser state, then a load
    resumed_captured.load_state_dict(saved(eager))
    resumed_eager.load_state_dict(saved(captured))
    for i in range(3, 5):
        batch = batches(eager, i)
        results = [agent.update(batch) for agent in (eager, resumed_captured, captured, resumed_eager)]
        assert_results_close(results[0], results[1])
        assert_results_close(results[2], results[3])
    assert_states_close(eager.state_dict(), resumed_captured.state_dict())
    assert_states_close(captured.state_dict(), resumed_eager.state_dict())


def test_auto_is_captured_on_cuda_only_and_off_everywhere_else() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert not capture_wanted("auto", cpu) and capture_wanted("auto", cuda)
    assert capture_wanted("always", cpu) and capture_wanted("always", cuda)
    assert not capture_wanted("never", cpu) and not capture_wanted("never", cuda)
    assert DQNAgent(DQNConfig(hidden_sizes=[8], device="cpu"), CARTPOLE)._captured is None
    assert SACAgent(SACConfig(hidden_sizes=[8], device="cpu"), PENDULUM)._captured is None
    assert APPOAgent(APPOConfig(hidden_sizes=[8], device="cpu"), CARTPOLE)._captured is None


@pytest.mark.parametrize("config_class", [DQNConfig, SACConfig, APPOConfig])
def test_a_capture_mode_outside_the_three_is_refused_by_name(config_class: type) -> None:
    with pytest.raises(ValueError, match=r"agent\.capture: must be one of auto, always, never, got 'yes'"):
        config_class(capture="yes").check()


def test_the_yaml_values_parse_and_on_off_are_refused_with_the_key() -> None:
    """YAML reads on/off as booleans: the modes are auto/always/never, and a boolean is refused
    with the key named, before anything runs."""
    from zmqrl.api import load_config
    from zmqrl.errors import ConfigError

    path = Path(__file__).resolve().parents[1] / "configs" / "cartpole_dqn.yaml"
    assert load_config(path, ["agent.capture=always"]).agent.capture == "always"  # type: ignore[attr-defined]
    assert load_config(path, []).agent.capture == "auto"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"agent\.capture"):
        load_config(path, ["agent.capture=on"])


def test_a_new_batch_shape_gets_its_own_buffers_and_the_oldest_are_dropped() -> None:
    """A batch of another size is not squeezed into the first one's buffers; beyond MAX_GRAPHS
    signatures the least recently used goes."""
    from zmqrl.agents import capture

    agent = DQNAgent(DQNConfig(hidden_sizes=[8], device="cpu", capture="always"), CARTPOLE, seed=0)
    twin = DQNAgent(DQNConfig(hidden_sizes=[8], device="cpu", capture="never"), CARTPOLE, seed=0)
    make = dqn_batch(CARTPOLE)
    for i, rows in enumerate([32, 8, 16, 4, 2, 8]):
        batch = TransitionBatch(*(np.asarray(column)[:rows] for column in make(agent, i)))
        assert_results_close(twin.update(batch), agent.update(batch))
    assert isinstance(agent._captured, CapturedUpdate)
    assert len(agent._captured._signatures) == capture.MAX_GRAPHS


def test_importance_of_the_wrong_shape_is_refused_before_anything_changes() -> None:
    agent = DQNAgent(DQNConfig(hidden_sizes=[8], device="cpu", capture="always"), CARTPOLE, seed=0)
    batch = dqn_batch(CARTPOLE)(agent, 0)
    assert isinstance(batch, TransitionBatch)
    before = saved(agent)
    with pytest.raises(ValueError, match=r"importance must have shape \(32,\)"):
        agent.update(batch, np.ones((32, 1), np.float32))
    assert_states_close(before, saved(agent), exact=True)


def test_cpu_agents_never_import_the_compiler() -> None:
    """A learner keeps torch._dynamo out (zmqrl.learner.dynamo_import: ~0.7 s of start-up): the
    default (auto, eager on a CPU) and the captured code on a CPU both train without it."""
    script = """
import sys
import numpy as np
from zmqrl.learner.dynamo_import import defer_adam_step_import, defer_dynamo_import
defer_dynamo_import(); defer_adam_step_import()
from zmqrl.agents.configs import DQNConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch
spec = SampleSpec((4,), "float32", (), "int64", num_actions=2)
rng = np.random.default_rng(0)
obs = rng.normal(size=(8, 4)).astype(np.float32)
batch = TransitionBatch(obs, rng.integers(0, 2, 8), np.ones(8, np.float32), obs, np.ones(8, np.float32))
for capture in ("auto", "always"):
    agent = DQNAgent(DQNConfig(hidden_sizes=[8], device="cpu", capture=capture), spec, seed=0)
    for _ in range(3):
        agent.update(batch).td_errors
    agent.load_state_dict(agent.state_dict())
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
