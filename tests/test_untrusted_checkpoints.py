"""A checkpoint is data: the config stored in it never makes zmqrl import or call code (issue 23,
item 1), unless the caller supplies that value (--set, --config) or trusts the file
(--trust-config, trust_config=True). Registered names still load from any checkpoint."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import zmqrl
from tests import untrusted_code
from tests.conftest import REPO
from tests.plugins.linear_q import LinearQConfig
from zmqrl.agents import make_learner, registry
from zmqrl.agents.registry import unregister_agent
from zmqrl.checkpoints.files import save_checkpoint
from zmqrl.code_trust import UntrustedCode
from zmqrl.config import Config, config_from_dict, load_config
from zmqrl.envs.factory import make_env, sample_spec
from zmqrl.evaluator.greedy import evaluate_checkpoint

CORRIDOR = "tests.example_envs:make_env"
MARKER = untrusted_code.__name__  # "tests.untrusted_code": records every import of itself
MARKER_ENV = f"{MARKER}:make_env"  # an env factory
MARKER_GYM_ID = f"{MARKER}:Trap-v0"  # gymnasium's own form: imports the module, then looks the id up
MARKER_KIND = f"{MARKER}:PLUGIN"  # an agent plugin
LINEAR_KIND = "tests.plugins.linear_q:PLUGIN"


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the marker module appends to when imported (here or in a subprocess); the module
    is taken out of sys.modules so that an import in this process is seen too."""
    path = tmp_path / "imports.log"
    monkeypatch.setenv(untrusted_code.RECORD_ENV, str(path))
    monkeypatch.delitem(sys.modules, MARKER)
    return path


def assert_not_imported(record: Path) -> None:
    assert MARKER not in sys.modules and not record.exists(), "the checkpoint's module was imported"


def corridor_checkpoint(path: Path, kind: str = "dqn", **stored: Any) -> Config:
    """A real checkpoint of an agent for the corridor env (imported by the test itself), whose
    stored config then gets ``stored`` (dotted key with __ -> value); returns the config it ran."""
    cfg = load_config(None, [f"env.id={CORRIDOR}", f"agent.kind={kind}", "agent.batch_size=8"])
    env = make_env(cfg.env)
    agent = make_learner(cfg.agent, sample_spec(env), seed=0)
    env.close()
    data = cfg.to_dict()
    for key, value in stored.items():
        section, name = key.split("__")
        data[section][name] = value
    save_checkpoint(path, {"agent": agent.state_dict(), "config": data, "counters": {"updates": 0}})
    return cfg


def refusal(call: Any) -> str:
    with pytest.raises(UntrustedCode) as info:
        call()
    return str(info.value)


def zmqrl_eval(*args: str, record: Path) -> subprocess.CompletedProcess[str]:
    """``python -m zmqrl eval ...`` in a fresh process, from the repository root (where the test
    package imports), recording imports of the marker module to ``record``."""
    env = {**os.environ, untrusted_code.RECORD_ENV: str(record), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "zmqrl", "eval", *args, "--episodes", "1"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )


# ------------------------------------------------------------------------------ refused


@pytest.mark.parametrize(
    ("key", "value"),
    [("env.id", MARKER_ENV), ("env.id", MARKER_GYM_ID), ("agent.kind", MARKER_KIND)],
)
def test_a_stored_import_path_is_refused_by_every_loader_before_it_is_imported(
    tmp_path: Path, record: Path, key: str, value: str
) -> None:
    path = tmp_path / "best"
    # A registered env.id beside the agent's kind, so that the refusal is the kind's.
    corridor_checkpoint(path, **{"env__id": "CartPole-v1", key.replace(".", "__"): value})
    for load in (
        lambda: zmqrl.load_policy(path),
        lambda: evaluate_checkpoint(path, episodes=1),
        lambda: evaluate_checkpoint(path, episodes=1, overrides=["env.max_episode_steps=5"]),
    ):
        message = refusal(load)
        assert message.startswith(f"{path} (stored config): {key} '{value}'"), message
        assert "--trust-config" in message and "trust_config=True" in message and "\n" not in message
        assert_not_imported(record)


def test_setting_another_agent_key_does_not_import_the_stored_kind(tmp_path: Path, record: Path) -> None:
    path = tmp_path / "best"
    corridor_checkpoint(path, env__id="CartPole-v1", agent__kind=MARKER_KIND)
    message = refusal(lambda: evaluate_checkpoint(path, episodes=1, overrides=["agent.lr=0.5"]))
    assert f"agent.kind '{MARKER_KIND}'" in message
    assert_not_imported(record)


def test_zmqrl_eval_of_a_checkpoint_naming_os_makedirs_creates_nothing(tmp_path: Path) -> None:
    """The report's case: a checkpoint whose env.id is 'os:makedirs' made a directory on load."""
    path = tmp_path / "ckpt"
    target = tmp_path / "made-by-the-checkpoint"
    corridor_checkpoint(path, env__id="os:makedirs", env__kwargs={"name": str(target)})
    result = zmqrl_eval(str(path), record=tmp_path / "imports.log")
    assert result.returncode == 2, result.stdout + result.stderr
    assert not target.exists(), "the checkpoint's env.id was called"
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"error: {path} (stored config): env.id 'os:makedirs'"), line
    assert "--trust-config" in line and "trust_config=True" in line and "--set env.id=" in line


def test_zmqrl_eval_imports_the_stored_module_only_with_trust_config(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    record = tmp_path / "imports.log"
    corridor_checkpoint(path, env__id=MARKER_ENV)
    refused = zmqrl_eval(str(path), record=record)
    assert refused.returncode == 2 and "--trust-config" in refused.stderr, refused.stderr
    assert not record.exists(), "the checkpoint's module was imported"
    trusted = zmqrl_eval(str(path), "--trust-config", record=record)
    assert trusted.returncode == 0 and "mean return" in trusted.stdout, trusted.stderr
    assert record.exists(), "with --trust-config the stored factory makes the env"


# ------------------------------------------------------------------------------ opted in


def test_the_callers_own_values_and_trust_load_what_the_stored_config_names(
    tmp_path: Path, record: Path
) -> None:
    path = tmp_path / "best"
    cfg = corridor_checkpoint(path, kind=LINEAR_KIND, env__id=MARKER_ENV)
    # Trust: the stored factory and plugin are imported.
    policy = zmqrl.load_policy(path, trust_config=True)
    assert policy.config.env.id == MARKER_ENV and MARKER in sys.modules
    # The caller's config: what the run trained with, in code or as its file.
    assert zmqrl.load_policy(path, config=cfg).config.env.id == CORRIDOR
    (tmp_path / "config.yaml").write_text(f"env: {{id: '{CORRIDOR}'}}\nagent: {{kind: '{LINEAR_KIND}'}}\n")
    result = evaluate_checkpoint(path, episodes=1, config=tmp_path / "config.yaml")
    assert len(result.returns) == 1
    # --set of both keys, in either order (agent.kind is applied first: it decides agent.* keys).
    sets = ["agent.lr=0.01", f"agent.kind={LINEAR_KIND}", f"env.id={CORRIDOR}"]
    assert len(evaluate_checkpoint(path, episodes=1, overrides=sets).returns) == 1


def test_zmqrl_eval_plays_with_the_config_file_given(tmp_path: Path) -> None:
    path = tmp_path / "ckpt"
    corridor_checkpoint(path, env__id=MARKER_ENV)
    config = tmp_path / "run.yaml"
    config.write_text(f"env:\n  id: {CORRIDOR}\nagent:\n  batch_size: 8\n")
    result = zmqrl_eval(str(path), "--config", str(config), record=tmp_path / "imports.log")
    assert result.returncode == 0 and "mean return" in result.stdout, result.stderr
    assert not (tmp_path / "imports.log").exists()


# ------------------------------------------------------------------------------ registered names


@pytest.fixture
def installed_linear_q(tmp_path: Path) -> Iterator[None]:
    """The linear agent installed under the zmqrl.agents entry points as 'linear_q'."""
    dist = tmp_path / "site" / "zmqrl_trust_agents-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: zmqrl-trust-agents\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(f"[zmqrl.agents]\nlinear_q = {LINEAR_KIND}\n")
    sys.path.insert(0, str(dist.parent))
    registry.reload_entry_points()
    yield
    sys.path.remove(str(dist.parent))
    unregister_agent("linear_q")
    registry.reload_entry_points()


def test_registered_ids_and_installed_agents_load_from_stored_data(installed_linear_q: None) -> None:
    sac: dict[str, Any] = {"env": {"id": "Pendulum-v1"}, "agent": {"kind": "sac"}}
    assert config_from_dict(sac, "<checkpoint>").agent.kind == "sac"
    installed: dict[str, Any] = {"env": {"id": "CartPole-v1"}, "agent": {"kind": "linear_q", "lr": 0.2}}
    agent = config_from_dict(installed, "<checkpoint>").agent
    assert isinstance(agent, LinearQConfig) and agent.lr == 0.2


def test_configs_of_the_operator_and_in_code_stay_trusted(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"env:\n  id: {CORRIDOR}\nagent:\n  kind: {LINEAR_KIND}\n")
    cfg = load_config(config)
    assert zmqrl.validate(cfg).agent.kind == LINEAR_KIND
    assert config_from_dict(cfg.to_dict(), "<run directory>", trusted=True).env.id == CORRIDOR
    with pytest.raises(UntrustedCode):
        config_from_dict(cfg.to_dict(), "<checkpoint>")


def test_a_config_whose_network_does_not_fit_the_weights_says_which_config_to_use(tmp_path: Path) -> None:
    path = tmp_path / "best"
    cfg = corridor_checkpoint(path)
    other = tmp_path / "other.yaml"
    other.write_text(f"env:\n  id: {CORRIDOR}\nagent:\n  hidden_sizes: [7]\n")
    with pytest.raises(ValueError) as info:
        evaluate_checkpoint(path, episodes=1, config=other)
    message = str(info.value)
    assert "does not fit" in message and "config.yaml" in message and "\n" not in message
    assert len(evaluate_checkpoint(path, episodes=1, config=cfg).returns) == 1
