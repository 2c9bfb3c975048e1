"""Config loading: defaults, strict YAML sections, --set overrides, range checks, the CLI edge."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from zmqrl.config import Config, ConfigError, load_config, save_config
from zmqrl.spec import MAX_CORE_SIZE

REPO = Path(__file__).parents[1]
EXAMPLE_CONFIG = REPO / "configs" / "cartpole_dqn.yaml"


def write(tmp_path: Path, text: str, name: str = "run.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def config_error(path: Path | None, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def zmqrl(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A wide, colourless terminal keeps rich's help text from wrapping or styling option names.
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [sys.executable, "-m", "zmqrl", *args],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


# ---------------------------------------------------------------------------------------- defaults


def test_no_file_gives_working_cartpole_dqn_defaults() -> None:
    cfg = load_config(None)
    assert cfg == Config()
    assert cfg.env.id == "CartPole-v1"
    assert cfg.agent.kind == "dqn"
    assert cfg.learner.min_replay_size <= cfg.replay.capacity


def test_example_config_in_repo_loads_and_passes_checks() -> None:
    cfg = load_config(EXAMPLE_CONFIG)
    assert cfg.env.id == "CartPole-v1"
    assert cfg.agent.kind == "dqn"
    assert cfg.run_dir == Path(cfg.run.dir) / cfg.run.name


def test_empty_file_means_all_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "")) == Config()
    assert load_config(write(tmp_path, "# nothing but a comment\n")) == Config()


def test_empty_section_means_that_sections_defaults(tmp_path: Path) -> None:
    assert load_config(write(tmp_path, "learner:\nagent:\n")) == Config()


def test_file_values_replace_defaults_and_ints_become_floats(tmp_path: Path) -> None:
    path = write(tmp_path, "agent:\n  lr: 1\n  hidden_sizes: [32]\nreplay:\n  capacity: 5000\n")
    cfg = load_config(path)
    assert cfg.agent.lr == 1.0 and isinstance(cfg.agent.lr, float)
    assert cfg.agent.hidden_sizes == [32]
    assert cfg.replay.capacity == 5000
    assert cfg.learner == Config().learner


# ------------------------------------------------------------------------------- bad config files


def test_unknown_key_names_file_and_key_and_suggests_close_match(tmp_path: Path) -> None:
    path = write(tmp_path, "learner:\n  max_update: 5\n")
    message = config_error(path)
    assert str(path) in message
    assert "'learner.max_update'" in message
    assert "learner.max_updates" in message  # the suggestion


def test_unknown_section_names_file_and_section(tmp_path: Path) -> None:
    path = write(tmp_path, "learnr:\n  max_updates: 5\n")
    message = config_error(path)
    assert str(path) in message
    assert "learnr" in message
    assert "learner" in message  # suggested


def test_unknown_key_without_close_match_lists_known_keys(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "replay:\n  zzz: true\n"))
    assert "replay.zzz" in message
    assert "capacity" in message


@pytest.mark.parametrize(
    ("text", "line", "key"),
    [
        ("learner:\n  max_updates: 10\n  max_updates: 20\n", 3, "max_updates"),
        ("learner:\n  max_updates: 10\nreplay: {}\nlearner:\n  min_replay_size: 50\n", 4, "learner"),
    ],
)
def test_a_key_given_twice_is_refused_where_it_repeats(
    tmp_path: Path, text: str, line: int, key: str
) -> None:
    """PyYAML keeps the last of two equal keys: a second ``learner:`` section silently dropped every
    setting of the first. Now the file, the line and the key are named."""
    path = write(tmp_path, text)
    message = config_error(path)
    assert message.startswith(f"{path}: not valid YAML at line {line}, column ")
    assert f"'{key}' is given twice in one mapping (first at line " in message


@pytest.mark.parametrize("name", ["../../etc/x", "a/b", "..", ".", '""'])
def test_a_run_name_is_one_folder_name(tmp_path: Path, name: str) -> None:
    """``--name ../../etc/x`` wrote a run into /etc/x: the name is the run's folder under run.dir."""
    message = config_error(None, [f"run.dir={tmp_path}", f"run.name={name}"])
    assert message.startswith(f"--set 'run.name={name}': run.name ") and "one folder name" in message
    assert load_config(None, ["run.name=cartpole dqn (seed 1)"]).run.name == "cartpole dqn (seed 1)"


def test_merge_keys_still_let_a_mapping_override_what_it_merges(tmp_path: Path) -> None:
    text = "learner:\n  <<: {max_updates: 10, min_replay_size: 50}\n  max_updates: 20\n"
    cfg = load_config(write(tmp_path, text))
    assert (cfg.learner.max_updates, cfg.learner.min_replay_size) == (20, 50)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("replay:\n  capacity: lots\n", "replay.capacity"),  # string for an int
        ("replay:\n  capacity: true\n", "replay.capacity"),  # bool is not an int
        ("learner:\n  max_updates: 2.5\n", "learner.max_updates"),  # fractional float for an int
        ("agent:\n  lr: [0.1]\n", "agent.lr"),  # list for a float
        ("agent:\n  dueling: 1\n", "agent.dueling"),  # int for a bool
        ("agent:\n  hidden_sizes: 64\n", "agent.hidden_sizes"),  # scalar for a list
        ("agent:\n  hidden_sizes: [64, wide]\n", "agent.hidden_sizes[1]"),  # bad list element
        ("env:\n  kwargs: [1, 2]\n", "env.kwargs"),  # list for a mapping
        ("learner:\n  max_seconds: soon\n", "learner.max_seconds"),  # optional float
    ],
)
def test_wrong_type_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    message = config_error(path)
    assert str(path) in message
    assert f"'{key}'" in message


def test_section_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "learner: 5000\n")
    message = config_error(path)
    assert str(path) in message
    assert "'learner'" in message and "mapping" in message


def test_top_level_that_is_not_a_mapping_is_rejected(tmp_path: Path) -> None:
    path = write(tmp_path, "- learner\n- actor\n")
    message = config_error(path)
    assert str(path) in message and "mapping" in message


def test_invalid_yaml_names_file(tmp_path: Path) -> None:
    path = write(tmp_path, "learner:\n  max_updates: [1, 2\n")
    message = config_error(path)
    assert str(path) in message and "YAML" in message


def test_missing_file_names_file(tmp_path: Path) -> None:
    path = tmp_path / "nowhere.yaml"
    message = config_error(path)
    assert str(path) in message and "not found" in message


# ------------------------------------------------------------------------------------ range checks


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("replay:\n  capacity: 0\n", "replay.capacity"),
        ("actor:\n  epsilon: 1.5\n", "actor.epsilon"),
        ("actor:\n  num_actors: 0\n", "actor.num_actors"),
        ("agent:\n  gamma: 0\n", "agent.gamma"),
        ("agent:\n  tau: 2\n", "agent.tau"),
        ("agent:\n  device: tpu\n", "agent.device"),
        ("learner:\n  min_replay_size: 200\nreplay:\n  capacity: 100\n", "learner.min_replay_size"),
        ("transport:\n  samples: 127.0.0.1:5555\n", "transport.samples"),
        ("supervisor:\n  heartbeat_timeout: 0.5\n", "supervisor.heartbeat_timeout"),
        ("run:\n  log_level: loud\n", "run.log_level"),
    ],
)
def test_out_of_range_value_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    path = write(tmp_path, text)
    message = config_error(path)
    assert str(path) in message
    assert key in message


# ---------------------------------------------------------------------------------- --set overrides


def test_set_values_are_parsed_as_yaml() -> None:
    cfg = load_config(
        None,
        [
            "learner.max_updates=7",
            "agent.lr=0.01",
            "agent.dueling=true",
            "agent.hidden_sizes=[32, 16]",
            "learner.max_seconds=2.5",
            "env.kwargs={render_mode: rgb_array}",
            "run.name=smoke",
        ],
    )
    assert cfg.learner.max_updates == 7
    assert cfg.agent.lr == 0.01
    assert cfg.agent.dueling is True
    assert cfg.agent.hidden_sizes == [32, 16]
    assert cfg.learner.max_seconds == 2.5
    assert cfg.env.kwargs == {"render_mode": "rgb_array"}
    assert cfg.run.name == "smoke"


def test_set_null_or_empty_value_clears_an_optional_field() -> None:
    assert load_config(EXAMPLE_CONFIG).learner.target_return is not None
    assert load_config(EXAMPLE_CONFIG, ["learner.target_return=null"]).learner.target_return is None
    assert load_config(EXAMPLE_CONFIG, ["learner.target_return="]).learner.target_return is None


def test_set_wins_over_file_and_leaves_other_file_values(tmp_path: Path) -> None:
    path = write(tmp_path, "learner:\n  max_updates: 100\n  sync_interval: 9\n")
    cfg = load_config(path, ["learner.max_updates=7"])
    assert cfg.learner.max_updates == 7
    assert cfg.learner.sync_interval == 9


def test_last_set_of_the_same_key_wins() -> None:
    assert load_config(None, ["learner.max_updates=7", "learner.max_updates=8"]).learner.max_updates == 8


def test_set_int_for_float_field_becomes_float() -> None:
    lr = load_config(None, ["agent.lr=1"]).agent.lr
    assert lr == 1.0 and isinstance(lr, float)


def test_set_float_in_exponent_notation() -> None:
    # PyYAML reads "1e-4" (no dot) as a string; learning rates are written this way all the time.
    assert load_config(None, ["agent.lr=1e-4"]).agent.lr == pytest.approx(1e-4)


def test_set_into_a_section_left_empty_in_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, "learner:\n")
    assert load_config(path, ["learner.max_updates=7"]).learner.max_updates == 7


def test_set_unknown_key_is_rejected_naming_the_key() -> None:
    message = config_error(None, ["learner.max_update=7"])
    assert "'learner.max_update'" in message
    assert "learner.max_updates" in message


def test_set_unknown_section_is_rejected_naming_the_section() -> None:
    assert "'lerner'" in config_error(None, ["lerner.max_updates=7"])


def test_set_wrong_type_is_rejected_naming_the_key() -> None:
    assert "'learner.max_updates'" in config_error(None, ["learner.max_updates=many"])


def test_set_value_is_range_checked() -> None:
    assert "actor.epsilon" in config_error(None, ["actor.epsilon=1.5"])


def test_an_out_of_range_set_is_named_in_the_error(tmp_path: Path) -> None:
    path = write(tmp_path, "actor:\n  epsilon: 0.5\n")
    assert config_error(path, ["actor.epsilon=1.5"]).startswith("--set 'actor.epsilon=1.5': actor.epsilon")
    assert config_error(write(tmp_path, "actor:\n  epsilon: 1.5\n")).startswith(f"{path}: actor.epsilon")


def test_set_reaches_a_key_of_a_nested_section(tmp_path: Path) -> None:
    path = write(tmp_path, "env:\n  atari:\n    noop_max: 7\n")
    cfg = load_config(path, ["env.atari.frame_stack=2"])
    assert (cfg.env.atari.frame_stack, cfg.env.atari.noop_max) == (2, 7)
    assert "'env.atari.frame_stak'" in config_error(None, ["env.atari.frame_stak=2"])


@pytest.mark.parametrize("item", ["learner.max_updates", "max_updates=7"])
def test_malformed_set_shows_the_expected_form(item: str) -> None:
    message = config_error(None, [item])
    assert item in message
    assert "section.key=value" in message


# -------------------------------------------------------------------------------------- round trip


def test_saved_config_loads_back_equal(tmp_path: Path) -> None:
    cfg = load_config(
        EXAMPLE_CONFIG,
        [
            "env.kwargs={render_mode: rgb_array}",
            "env.max_episode_steps=200",
            "learner.max_seconds=30",
            "agent.hidden_sizes=[8, 4]",
            "actor.max_steps=null",
        ],
    )
    path = tmp_path / "run" / "config.yaml"
    save_config(cfg, path)
    assert load_config(path) == cfg
    assert not list(path.parent.glob("*.tmp"))  # written atomically, no leftovers


def test_saved_defaults_load_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    save_config(Config(), path)
    assert load_config(path) == Config()


# --------------------------------------------------------------------------------------------- CLI


def test_cli_config_with_unknown_key_exits_2_with_one_error_line(tmp_path: Path) -> None:
    write(tmp_path, "learner:\n  max_update: 5\n", name="bad.yaml")
    result = zmqrl(tmp_path, "config", "bad.yaml")
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error:")
    assert "bad.yaml" in lines[0] and "learner.max_update" in lines[0]


def test_cli_config_with_missing_file_exits_2(tmp_path: Path) -> None:
    result = zmqrl(tmp_path, "config", "absent.yaml")
    assert result.returncode == 2
    assert result.stderr.startswith("error:") and "absent.yaml" in result.stderr
    assert result.stdout == ""


def test_cli_launch_with_bad_config_exits_2_before_starting_anything(tmp_path: Path) -> None:
    write(tmp_path, "actor:\n  num_actor: 1\n", name="bad.yaml")
    result = zmqrl(tmp_path, "launch", "bad.yaml")
    assert result.returncode == 2
    assert "actor.num_actor" in result.stderr
    assert result.stdout == ""  # the supervisor announces the run directory as its first act
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # no runs/, no logs


def test_cli_config_prints_resolved_yaml_with_overrides(tmp_path: Path) -> None:
    write(tmp_path, "learner:\n  max_updates: 100\n", name="good.yaml")
    result = zmqrl(tmp_path, "config", "good.yaml", "--set", "learner.max_updates=7", "-s", "agent.lr=1")
    assert result.returncode == 0, result.stderr
    assert "max_updates: 7" in result.stdout
    resolved = yaml.safe_load(result.stdout)
    assert resolved["learner"]["max_updates"] == 7
    assert resolved["agent"]["lr"] == 1.0
    assert set(resolved) == {f.name for f in dataclasses.fields(Config)}


@pytest.mark.parametrize("args", [("--help",), ("launch", "--help")])
def test_cli_help_exits_0_and_mentions_set(tmp_path: Path, args: tuple[str, ...]) -> None:
    result = zmqrl(tmp_path, *args)
    assert result.returncode == 0, result.stderr
    assert "--set" in result.stdout


@pytest.mark.parametrize("role", ["launch", "learner", "actor", "evaluator"])
def test_bin_scripts_run_from_a_checkout(role: str) -> None:
    script = Path(__file__).resolve().parents[1] / "bin" / f"zmqrl-{role}"
    result = subprocess.run(
        [sys.executable, str(script), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert "--set" in result.stdout


# ---------------------------------------------------------------------------------- agent kinds


def test_agent_kind_picks_the_agent_config_class(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "agent:\n  kind: sac\n  actor_lr: 0.001\n"))
    assert type(cfg.agent).__name__ == "SACConfig"
    assert cfg.agent.actor_lr == 0.001
    assert type(load_config(None).agent).__name__ == "DQNConfig"


def test_a_key_of_another_agent_kind_is_named_as_unknown(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "agent:\n  kind: sac\n  dueling: true\n"))
    assert "agent.dueling" in message and "run.yaml" in message


def test_unknown_agent_kind_lists_the_known_ones(tmp_path: Path) -> None:
    message = config_error(write(tmp_path, "agent:\n  kind: ppo\n"))
    assert "agent.kind" in message and "dqn" in message and "sac" in message


def test_overrides_switch_agent_kind_and_set_its_keys() -> None:
    cfg = load_config(None, ["agent.kind=sac", "agent.alpha=0.2", "agent.autotune=false"])
    assert type(cfg.agent).__name__ == "SACConfig"
    assert (cfg.agent.alpha, cfg.agent.autotune) == (0.2, False)
    assert "agent.critic_lr" in config_error(None, ["agent.critic_lr=0.1"])  # a DQN run has no critic


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("replay.alpha=-1", "replay.alpha"),
        ("replay.beta=1.5", "replay.beta"),
        ("learner.samples_per_insert=0", "learner.samples_per_insert"),
        ("learner.max_policy_lag=0", "learner.max_policy_lag"),
        ("actor.envs_per_actor=0", "actor.envs_per_actor"),
        ("env.preprocess=mario", "env.preprocess"),
        ("env.atari.frame_stack=0", "env.atari.frame_stack"),
        ("evaluator.episodes=0", "evaluator.episodes"),
    ],
)
def test_issue4_options_are_range_checked(override: str, key: str) -> None:
    assert key in config_error(None, [override])


def test_nested_env_atari_section_round_trips_through_yaml(tmp_path: Path) -> None:
    cfg = load_config(write(tmp_path, "env:\n  preprocess: atari\n  atari:\n    frame_stack: 2\n"))
    assert cfg.env.atari.frame_stack == 2 and cfg.env.atari.frame_skip == 4
    save_config(cfg, tmp_path / "out.yaml")
    again = load_config(tmp_path / "out.yaml")
    assert again == cfg


# configs/tune/ holds search spaces for `zmqrl tune`, not configs (tests/test_tune_space.py checks them).
SHIPPED_CONFIGS = sorted(p for p in (REPO / "configs").rglob("*.yaml") if p.parent.name != "tune")


@pytest.mark.parametrize("path", SHIPPED_CONFIGS, ids=lambda p: str(p.relative_to(REPO / "configs")))
def test_every_shipped_config_loads_and_names_its_run_after_its_file(path: Path) -> None:
    cfg = load_config(path)
    assert cfg.run.name == path.stem


@pytest.mark.parametrize("config", ["cartpole_novel_r2d2.yaml", "cartpole_novel_lstm_appo.yaml"])
def test_an_lstm_wider_than_any_spec_or_export_takes_names_the_key_and_the_file(
    tmp_path: Path, config: str
) -> None:
    """A recurrent run's state crosses the wire in every message and an ONNX export declares its
    width; both refuse more than MAX_CORE_SIZE units, so the config does before anything starts."""
    data = yaml.safe_load((REPO / "configs" / config).read_text())
    data["agent"]["core_size"] = MAX_CORE_SIZE
    assert load_config(write(tmp_path, yaml.safe_dump(data))).agent.core_size == MAX_CORE_SIZE
    data["agent"]["core_size"] = MAX_CORE_SIZE + 1
    message = config_error(write(tmp_path, yaml.safe_dump(data), "wide.yaml"))
    assert "wide.yaml" in message and "agent.core_size: must be" in message and str(MAX_CORE_SIZE) in message


@pytest.mark.parametrize(
    ("config", "key", "value"),
    [
        ("cartpole_dqn.yaml", "agent.lr", ".inf"),  # trains nothing: every step non-finite
        ("cartpole_dqn.yaml", "agent.max_grad_norm", ".nan"),  # NaN > 0 is false: clipping silently off
        ("cartpole_dqn.yaml", "agent.adam_eps", ".inf"),  # every Adam step 0: nothing learns, no error
        ("cartpole_dqn.yaml", "learner.samples_per_insert", ".inf"),  # "no limit" is null
        ("cartpole_dqn.yaml", "learner.target_return", "-.inf"),
        ("cartpole_appo.yaml", "agent.vf_coef", ".inf"),
        ("pendulum_sac.yaml", "agent.alpha", ".inf"),
        ("cartpole_novel_r2d2.yaml", "agent.huber_delta", ".nan"),
    ],
)
def test_no_setting_takes_nan_or_an_infinity_and_the_error_names_where_it_came_from(
    tmp_path: Path, config: str, key: str, value: str
) -> None:
    data = yaml.safe_load((REPO / "configs" / config).read_text())
    section, name = key.split(".")
    data.setdefault(section, {})[name] = "PLACEHOLDER"
    path = write(tmp_path, yaml.safe_dump(data).replace("PLACEHOLDER", value), "bad.yaml")
    message = config_error(path)
    assert message.startswith(f"{path}: {key} must be a finite number"), message
    given = config_error(REPO / "configs" / config, [f"{key}={value}"])  # the --set is named instead
    assert given.startswith(f"--set '{key}={value}': {key} must be a finite number"), given


def test_an_envs_own_arguments_are_its_to_check() -> None:
    """env.kwargs go whole to the env's constructor, which may well take an infinity."""
    assert load_config(None, ['env.kwargs={"x": .inf}']).env.kwargs == {"x": float("inf")}
