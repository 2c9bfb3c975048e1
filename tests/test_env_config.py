"""Config from the environment: ZMQRL_<SECTION>__<KEY> variables, between the file and --set."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from zmqrl.config import (
    ConfigError,
    config_from_dict,
    environment_overrides,
    load_config,
    without_config_variables,
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text)
    return path


def env_error(environ: dict[str, str], overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(None, overrides, environ=environ)
    return str(info.value)


# ------------------------------------------------------------------------------------- precedence


def test_file_then_environment_then_set(tmp_path: Path) -> None:
    path = write(tmp_path, "learner:\n  max_updates: 100\n  sync_interval: 9\n")
    environ = {"ZMQRL_LEARNER__MAX_UPDATES": "200"}
    assert load_config(path, environ={}).learner.max_updates == 100
    assert load_config(path, environ=environ).learner.max_updates == 200
    cfg = load_config(path, ["learner.max_updates=300"], environ=environ)
    assert cfg.learner.max_updates == 300
    assert cfg.learner.sync_interval == 9  # what neither layer names stays as the file says


def test_defaults_take_the_environment_too() -> None:
    assert load_config(None, environ={"ZMQRL_RUN__NAME": "from-env"}).run.name == "from-env"


def test_os_environ_is_the_default_source(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZMQRL_ACTOR__SEND_BATCH", "17")
    assert load_config(None).actor.send_batch == 17


def test_a_stored_config_read_back_ignores_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZMQRL_ACTOR__SEND_BATCH", "17")
    assert config_from_dict({}, "<checkpoint>").actor.send_batch == 64
    assert config_from_dict({}, "<checkpoint>", environ=os.environ).actor.send_batch == 17


def test_process_variables_without_a_double_underscore_are_not_config() -> None:
    environ = {
        "ZMQRL_SUPERVISED": "1",
        "ZMQRL_ACTOR_ID": "auto",
        "ZMQRL_HEALTH_FILE": "/tmp/h",
        "ZMQRL_LAUNCHED": "123.4",
        "PATH": "/usr/bin",
        "MY_LEARNER__MAX_UPDATES": "5",  # another program's variable with the same shape
    }
    assert environment_overrides(environ) == []
    assert load_config(None, environ=environ) == load_config(None, environ={})


def test_launched_processes_get_the_environment_without_its_config_variables() -> None:
    # Their resolved config file already holds these values; applied again over it, they would undo
    # the launch's own --set (e.g. --name given with ZMQRL_RUN__NAME in the environment).
    environ = {"ZMQRL_RUN__NAME": "env-name", "ZMQRL_SUPERVISED": "1", "HOME": "/root"}
    assert without_config_variables(environ) == {"ZMQRL_SUPERVISED": "1", "HOME": "/root"}


# ------------------------------------------------------------------------------------------ values


def test_values_are_read_as_yaml_like_set() -> None:
    cfg = load_config(
        None,
        environ={
            "ZMQRL_AGENT__DUELING": "true",
            "ZMQRL_AGENT__DOUBLE": "false",
            "ZMQRL_AGENT__HIDDEN_SIZES": "[64, 32]",
            "ZMQRL_AGENT__LR": "1e-4",
            "ZMQRL_LEARNER__MAX_SECONDS": "2.5",
            "ZMQRL_ENV__KWARGS": "{render_mode: rgb_array}",
            "ZMQRL_TRANSPORT__SAMPLES": "tcp://10.0.0.5:5555",
        },
    )
    assert cfg.agent.dueling is True and cfg.agent.double is False
    assert cfg.agent.hidden_sizes == [64, 32]
    assert cfg.agent.lr == pytest.approx(1e-4)
    assert cfg.learner.max_seconds == 2.5
    assert cfg.env.kwargs == {"render_mode": "rgb_array"}
    assert cfg.transport.samples == "tcp://10.0.0.5:5555"


@pytest.mark.parametrize("text", ["null", "~", ""])
def test_null_or_empty_clears_an_optional_field(tmp_path: Path, text: str) -> None:
    path = write(tmp_path, "learner:\n  target_return: 475\n")
    assert load_config(path, environ={"ZMQRL_LEARNER__TARGET_RETURN": text}).learner.target_return is None


def test_nested_sections_take_one_double_underscore_per_level(tmp_path: Path) -> None:
    path = write(tmp_path, "env:\n  atari:\n    noop_max: 7\n")
    cfg = load_config(path, environ={"ZMQRL_ENV__ATARI__FRAME_STACK": "2"})
    assert (cfg.env.atari.frame_stack, cfg.env.atari.noop_max, cfg.env.atari.frame_skip) == (2, 7, 4)


def test_agent_kind_applies_first_whatever_the_order_of_the_environment() -> None:
    # Dicts keep insertion order: the SAC-only key comes before the kind that makes it valid.
    cfg = load_config(None, environ={"ZMQRL_AGENT__ALPHA": "0.2", "ZMQRL_AGENT__KIND": "sac"})
    assert type(cfg.agent).__name__ == "SACConfig"
    assert cfg.agent.alpha == 0.2


def test_set_sees_the_agent_kind_the_environment_chose() -> None:
    cfg = load_config(None, ["agent.autotune=false"], environ={"ZMQRL_AGENT__KIND": "sac"})
    assert type(cfg.agent).__name__ == "SACConfig" and cfg.agent.autotune is False


def test_the_callers_mapping_is_not_modified() -> None:
    stored = {"env": {"atari": {"frame_stack": 4}}}
    config_from_dict(stored, "<checkpoint>", environ={"ZMQRL_ENV__ATARI__FRAME_STACK": "2"})
    assert stored == {"env": {"atari": {"frame_stack": 4}}}


# ------------------------------------------------------------------------------------------ errors


def test_an_unknown_key_names_the_variable_and_suggests_the_key() -> None:
    message = env_error({"ZMQRL_LEARNER__MAX_UPDATEZ": "5"})
    assert message.startswith("environment ZMQRL_LEARNER__MAX_UPDATEZ: unknown key 'learner.max_updatez'")
    assert "learner.max_updates" in message


def test_an_unknown_section_names_the_variable() -> None:
    message = env_error({"ZMQRL_LERNER__MAX_UPDATES": "5"})
    assert "ZMQRL_LERNER__MAX_UPDATES" in message and "'lerner'" in message


def test_a_wrong_type_names_the_variable_and_the_key() -> None:
    message = env_error({"ZMQRL_LEARNER__MAX_UPDATES": "lots"})
    assert "ZMQRL_LEARNER__MAX_UPDATES" in message and "'learner.max_updates' must be int" in message


def test_an_out_of_range_value_is_blamed_on_its_variable(tmp_path: Path) -> None:
    message = env_error({"ZMQRL_ACTOR__EPSILON": "1.5"})
    assert message.startswith("environment ZMQRL_ACTOR__EPSILON: actor.epsilon must be in [0, 1]")


def test_a_set_that_fixes_the_key_does_not_excuse_a_bad_variable() -> None:
    # Every layer is checked as it is applied: a typo in a container's environment must surface.
    assert "ZMQRL_LEARNER__MAX_UPDATES" in env_error(
        {"ZMQRL_LEARNER__MAX_UPDATES": "lots"}, ["learner.max_updates=5"]
    )


@pytest.mark.parametrize("name", ["ZMQRL_LEARNER__", "ZMQRL___MAX_UPDATES", "ZMQRL_ENV____ATARI"])
def test_a_malformed_name_shows_the_expected_form(name: str) -> None:
    message = env_error({name: "5"})
    assert name in message and "ZMQRL_SECTION__KEY" in message


def test_a_key_below_a_plain_value_is_refused() -> None:
    message = env_error({"ZMQRL_LEARNER__MAX_UPDATES__X": "5"})
    assert "ZMQRL_LEARNER__MAX_UPDATES__X" in message and "learner.max_updates" in message


def test_the_cli_exits_2_with_one_line_naming_a_bad_variable(tmp_path: Path) -> None:
    env = {**os.environ, "ZMQRL_LEARNER__MAX_UPDATEZ": "5"}
    result = subprocess.run(
        [sys.executable, "-m", "zmqrl", "config", str(write(tmp_path, ""))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: environment ZMQRL_LEARNER__MAX_UPDATEZ: unknown key 'learner.max_updatez' "
        "(did you mean 'learner.max_updates'?)"
    ]


def test_the_cli_prints_what_the_environment_set(tmp_path: Path) -> None:
    env = {**os.environ, "ZMQRL_LEARNER__MAX_UPDATES": "1234"}
    result = subprocess.run(
        [sys.executable, "-m", "zmqrl", "config", str(write(tmp_path, ""))],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "max_updates: 1234" in result.stdout
