"""Agents from outside zmqrl: registered in code, named by import path, installed as entry points,
validated by the config loader, and trained end to end by `zmqrl launch`."""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import launch_to_the_end, tiny_overrides
from tests.plugins.linear_q import PLUGIN, LinearQAgent, LinearQConfig
from zmqrl.agents import make_learner, make_policy, make_priorities, registry
from zmqrl.agents.configs import AgentConfigBase
from zmqrl.agents.registry import AgentPlugin, agent_names, get_agent, register_agent, unregister_agent
from zmqrl.config import load_config
from zmqrl.core import LearningAgent, Policy, UpdateResult
from zmqrl.errors import ConfigError
from zmqrl.spec import SampleSpec
from zmqrl.types import TransitionBatch, Weights

KIND_PATH = "tests.plugins.linear_q:PLUGIN"
CARTPOLE = SampleSpec((4,), "float32", (), "int64", num_actions=2)
PENDULUM = SampleSpec((3,), "float32", (1,), "float32")


@pytest.fixture
def registered() -> Iterator[AgentPlugin]:
    register_agent(PLUGIN)
    yield PLUGIN
    unregister_agent(PLUGIN.name)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def config_error(path: Path | None, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def batch(n: int = 8) -> TransitionBatch:
    rng = np.random.default_rng(0)
    return TransitionBatch(
        obs=rng.normal(size=(n, 4)).astype(np.float32),
        action=rng.integers(2, size=n).astype(np.int64),
        reward=np.ones(n, np.float32),
        next_obs=rng.normal(size=(n, 4)).astype(np.float32),
        discount=np.full(n, 0.99, np.float32),
    )


# ------------------------------------------------------------------------------ registration


def test_an_agent_registered_in_code_is_built_through_the_registry(registered: AgentPlugin) -> None:
    assert "linear_q" in agent_names() and get_agent("linear_q") is registered
    learner = make_learner(LinearQConfig(), CARTPOLE, seed=0)
    policy = make_policy(LinearQConfig(), CARTPOLE, seed=1)
    assert isinstance(learner, LinearQAgent) and isinstance(learner, LearningAgent)
    assert isinstance(policy, Policy)
    result = learner.update(batch())
    assert isinstance(result, UpdateResult) and result.td_errors.shape == (8,) and not result.skipped
    policy.load_weights(learner.export_weights())
    priorities = make_priorities(LinearQConfig(), policy)
    assert priorities is not None and np.shape(priorities(batch())) == (8,)
    np.testing.assert_array_equal(policy.act(batch().obs, False), learner.act(batch().obs, False))
    with pytest.raises(ConfigError, match="needs a Discrete action space"):
        make_learner(LinearQConfig(), PENDULUM)
    with pytest.raises(ConfigError, match=r"agent\.lr"):
        make_learner(LinearQConfig(lr=-1.0), CARTPOLE)


def test_a_plugin_without_a_policy_acts_with_its_learner_on_the_cpu() -> None:
    @dataclasses.dataclass
    class LearnerOnlyConfig(LinearQConfig):
        kind: str = "learner_only"

    plugin = register_agent(
        dataclasses.replace(PLUGIN, name="learner_only", config_class=LearnerOnlyConfig, make_policy=None)
    )
    try:
        policy = make_policy(LearnerOnlyConfig(), CARTPOLE, seed=0)
        assert isinstance(policy, LinearQAgent)
        with pytest.raises(ValueError, match="already registered"):
            register_agent(dataclasses.replace(plugin, description="another"))
    finally:
        unregister_agent("learner_only")


class OldLinearQ:
    """An agent of the previous, wider contract: it numbers its weights, holds an epsilon, keeps
    the last TD errors beside update's metrics; its factories take action bounds and epsilon."""

    def __init__(self, config: LinearQConfig, epsilon: float) -> None:
        self.inner = LinearQAgent(config, 4, 2)
        self.epsilon, self.weights_version, self.last_td_errors = epsilon, 0, np.zeros(0, np.float32)

    def act(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        return self.inner.act(obs, explore)

    def update(self, batch: TransitionBatch, importance: np.ndarray | None = None) -> dict[str, float]:
        result = self.inner.update(batch, importance)
        self.last_td_errors = result.td_errors
        return dict(result.metrics)

    def import_weights(self, weights: Weights) -> bool:
        if weights.version <= self.weights_version:
            return False
        self.inner.load_weights(weights.arrays)
        self.weights_version = weights.version
        return True

    def export_weights(self) -> Weights:
        self.weights_version += 1
        return Weights(self.weights_version, self.inner.export_weights())

    def state_dict(self) -> dict[str, object]:
        return self.inner.state_dict()

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.inner.load_state_dict(state)


def test_an_agent_of_the_previous_contract_still_works_with_a_deprecation_warning() -> None:
    @dataclasses.dataclass
    class OldConfig(LinearQConfig):
        kind: str = "old_linear_q"

    def old_learner(config: OldConfig, spec: SampleSpec, *, seed: int | None, device: str | None,
                    action_low: np.ndarray | None, action_high: np.ndarray | None) -> OldLinearQ:  # fmt: skip
        assert action_low is None and action_high is None  # given from the spec (Discrete: none)
        return OldLinearQ(config, epsilon=0.0)

    def old_policy(config: OldConfig, spec: SampleSpec, *, seed: int | None, epsilon: float,
                   action_low: np.ndarray | None, action_high: np.ndarray | None) -> OldLinearQ:  # fmt: skip
        return OldLinearQ(config, epsilon=epsilon)

    old = AgentPlugin("old_linear_q", OldConfig, make_learner=old_learner, make_policy=old_policy)  # type: ignore[arg-type]
    register_agent(old)
    try:
        with pytest.warns(DeprecationWarning):
            learner = make_learner(OldConfig(), CARTPOLE, seed=0)
            policy = make_policy(OldConfig(), CARTPOLE, seed=0)
        result = learner.update(batch())
        assert result.td_errors.shape == (8,) and "loss" in result.metrics and not result.skipped
        arrays = learner.export_weights()
        assert set(arrays) == {"weight", "bias"}
        policy.load_weights(arrays)
        policy.load_weights(arrays)  # versions are numbered for it: a second load is not "older"
        np.testing.assert_array_equal(policy.act(batch().obs, True), learner.act(batch().obs, False))
    finally:
        unregister_agent("old_linear_q")


def test_a_plugin_missing_what_the_roles_read_is_refused_when_made() -> None:
    @dataclasses.dataclass
    class NoBatchSize:
        kind: str = "broken"
        gamma: float = 0.99
        n_step: int = 1
        device: str = "cpu"

    with pytest.raises(ConfigError, match="lacks the fields the roles read: batch_size"):
        AgentPlugin("broken", NoBatchSize, make_learner=PLUGIN.make_learner)

    @dataclasses.dataclass
    class WrongDefaultKind(AgentConfigBase):
        lr: float = 0.1

    with pytest.raises(ConfigError, match=r"kind defaults to ''.*kind: str = 'broken'"):
        AgentPlugin("broken", WrongDefaultKind, make_learner=PLUGIN.make_learner)
    with pytest.raises(ConfigError, match="must be an identifier"):
        AgentPlugin("my.agent", LinearQConfig, make_learner=PLUGIN.make_learner)


def test_an_unknown_kind_lists_the_available_names_and_close_matches(registered: AgentPlugin) -> None:
    with pytest.raises(ConfigError) as info:
        get_agent("linear_qq")
    message = str(info.value)
    assert "agent.kind 'linear_qq' is not known" in message
    assert all(name in message for name in ("dqn", "sac", "linear_q"))
    assert "did you mean 'linear_q'?" in message


# ------------------------------------------------------------------------------- import paths


def test_an_import_path_kind_is_validated_against_the_plugins_own_config(tmp_path: Path) -> None:
    path = write(tmp_path, f"agent:\n  kind: {KIND_PATH}\n  lr: 0.05\n  batch_size: 16\n")
    cfg = load_config(path, ["agent.gamma=0.9"])
    assert type(cfg.agent) is LinearQConfig and cfg.agent.kind == KIND_PATH
    assert (cfg.agent.lr, cfg.agent.batch_size, cfg.agent.gamma) == (0.05, 16, 0.9)
    assert isinstance(make_learner(cfg.agent, CARTPOLE, seed=0), LinearQAgent)

    unknown = config_error(write(tmp_path, f"agent:\n  kind: {KIND_PATH}\n  hidden_sizes: [8]\n"))
    assert "unknown key 'agent.hidden_sizes'" in unknown and "run.yaml" in unknown
    assert "agent.lr" in config_error(write(tmp_path, f"agent:\n  kind: {KIND_PATH}\n  lr: [1]\n"))
    assert "agent.lr" in config_error(None, [f"agent.kind={KIND_PATH}", "agent.lr=-1"])  # its check()
    assert "agent.dueling" in config_error(None, [f"agent.kind={KIND_PATH}", "agent.dueling=true"])


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        ("tests.plugins.no_such_module:PLUGIN", "cannot import module 'tests.plugins.no_such_module'"),
        ("tests.plugins.linear_q:NOT_THERE", "has no attribute 'NOT_THERE'"),
        ("tests.plugins.linear_q:LinearQAgent", "not a zmqrl.agents.registry.AgentPlugin"),
        ("tests.plugins.linear_q:", "must look like 'package.module:ATTRIBUTE'"),
    ],
)
def test_a_bad_import_path_is_a_config_error_naming_it(tmp_path: Path, kind: str, problem: str) -> None:
    message = config_error(write(tmp_path, f"agent:\n  kind: '{kind}'\n"))
    assert f"agent.kind '{kind}'" in message and problem in message and "run.yaml" in message


# ------------------------------------------------------------------------------- entry points


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[None]:
    """A distribution on sys.path declaring two agents: one that loads, one whose module is gone."""
    dist = tmp_path / "site" / "zmqrl_test_agents-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zmqrl-test-agents\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(
        f"[zmqrl.agents]\nlinear_q = {KIND_PATH}\nbroken = tests.plugins.gone:PLUGIN\n"
    )
    sys.path.insert(0, str(dist.parent))
    registry.reload_entry_points()
    yield
    sys.path.remove(str(dist.parent))
    unregister_agent("linear_q")
    registry.reload_entry_points()


def test_installed_agents_are_found_by_entry_point_and_loaded_only_when_named(installed: None) -> None:
    assert {"linear_q", "broken", "dqn", "sac"} <= set(agent_names())
    cfg = load_config(None, ["agent.kind=linear_q", "agent.lr=0.2"])
    assert type(cfg.agent) is LinearQConfig and cfg.agent.lr == 0.2
    assert load_config(None).agent.kind == "dqn", "a broken plugin must not stop other agents"
    with pytest.raises(ConfigError, match=r"agent.kind 'broken' \(entry point .*\) does not load"):
        get_agent("broken")


# ------------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_a_plugin_agent_trains_end_to_end_through_launch(tmp_path: Path) -> None:
    """`zmqrl launch` with the linear agent named by import path: the processes it starts find
    the plugin from the same config, the learner updates and publishes, the actor imports."""
    run_root = tmp_path / "runs"
    config = write(tmp_path, f"agent:\n  kind: {KIND_PATH}\n  lr: 0.001\n  batch_size: 16\n")
    overrides = [
        item
        for item in tiny_overrides(
            run_root,
            learner__max_updates=150,
            learner__min_replay_size=100,
            learner__eval_interval=0,  # only the final evaluation
            env__max_episode_steps=50,
            replay__prioritized="true",  # the actor sends the agent's initial priorities
        )
        if not item.startswith("agent.")
    ]
    result = launch_to_the_end(config, overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    stats = json.loads((run_root / "t" / "stats.json").read_text())
    learner = stats["learner"]
    assert learner["state"] == "finished" and learner["updates"] == 150
    assert learner["eval_history"], "no final evaluation"
    (actor,) = stats["actors"]
    assert actor["weights_version"] > 0 and actor["samples"] > 0
    assert (run_root / "t" / "checkpoints" / "latest").is_file()
