"""The errors people hit first, through the real CLI: each is one `error:` line on stderr that says
what to do next, with no traceback, and exits 2 for a setting or usage that cannot work, 1 for a
runtime failure (README "Troubleshooting")."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CARTPOLE = REPO / "configs" / "cartpole_dqn.yaml"
EXIT_RUNTIME, EXIT_CONFIG = 1, 2

# Runs the CLI after hiding modules (`import X` then raises ImportError, as if X were not
# installed) and, with "nocuda", after making torch see no CUDA device, as on this machine.
CLI_WITH = """
import sys
hidden, cuda, *args = sys.argv[1:]
for name in filter(None, hidden.split(",")):
    sys.modules[name] = None
if cuda == "nocuda":
    import torch
    torch.cuda.is_available = lambda: False
from zmqrl.cli.app import main
sys.argv = ["zmqrl", *args]
main()
"""


def zmqrl(*args: str, hide: tuple[str, ...] = (), no_cuda: bool = False) -> subprocess.CompletedProcess[str]:
    """``zmqrl ARGS`` in a fresh process, from the repository root, with no ZMQRL_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQRL_")}
    cmd = [sys.executable, "-c", CLI_WITH, ",".join(hide), "nocuda" if no_cuda else "-", *args]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def only_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """The one line a command that fails before starting anything writes to stderr."""
    assert result.returncode == code, (result.returncode, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def last_line(result: subprocess.CompletedProcess[str], code: int) -> str:
    """A role's error line: its last line on stderr, the only `error:` one, after its log records."""
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert [line for line in lines if line.startswith("error:")] == lines[-1:], result.stderr
    return lines[-1]


def sets(**values: object) -> list[str]:
    return [arg for key, value in values.items() for arg in ("--set", f"{key.replace('__', '.')}={value}")]


def launch(tmp_path: Path, *extra: str, **values: object) -> list[str]:
    """``launch`` of the CartPole config into tmp_path, every port chosen by the OS unless given."""
    ports = {
        f"transport__{name}": "tcp://127.0.0.1:0" for name in ("samples", "weights", "heartbeat", "control")
    }
    return ["launch", str(CARTPOLE), *extra, *sets(run__dir=tmp_path, run__name="t", **{**ports, **values})]


def nothing_started(tmp_path: Path) -> bool:
    return not (tmp_path / "t" / "logs").exists()


@contextlib.contextmanager
def port_in_use() -> Iterator[str]:
    """A loopback TCP endpoint someone else is listening on."""
    squatter = socket.socket()
    squatter.bind(("127.0.0.1", 0))
    squatter.listen()
    try:
        yield f"tcp://127.0.0.1:{squatter.getsockname()[1]}"
    finally:
        squatter.close()


def free_endpoint() -> str:
    """A loopback TCP endpoint nobody listens on (the OS just handed the port out and took it back)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


# ---------------------------------------------------------------------- (a) a port in use


@pytest.mark.parametrize("setting", ["samples", "weights", "heartbeat", "control"])
def test_launch_with_a_port_in_use_names_the_port_and_the_setting_and_starts_nothing(
    tmp_path: Path, setting: str
) -> None:
    with port_in_use() as taken:
        result = zmqrl(*launch(tmp_path, **{f"transport__{setting}": taken}))
    line = only_line(result, EXIT_RUNTIME)
    port = taken.rsplit(":", 1)[1]
    assert line.startswith(f"error: cannot bind {setting} on {taken}: address already in use"), line
    assert f"port {port}, setting transport.{setting}" in line
    assert "another zmqrl run?" in line and f"--set transport.{setting}=tcp://127.0.0.1:PORT" in line
    assert nothing_started(tmp_path)


def test_a_learner_started_by_hand_on_a_port_in_use_says_which_and_exits_1(tmp_path: Path) -> None:
    with port_in_use() as taken:
        result = zmqrl(
            "learner",
            str(CARTPOLE),
            *sets(
                run__dir=tmp_path,
                transport__samples=taken,
                transport__weights="tcp://127.0.0.1:0",
                transport__heartbeat=f"ipc://{tmp_path}/heartbeat",
                transport__control=f"ipc://{tmp_path}/control",
            ),
        )
    line = last_line(result, EXIT_RUNTIME)
    assert f"cannot bind samples on {taken}: address already in use" in line
    assert "setting transport.samples" in line


# ---------------------------------------------------------------------- (b) an unreachable learner


def test_an_actor_that_cannot_reach_its_learner_warns_after_seconds_then_exits_1(tmp_path: Path) -> None:
    """Started by hand, its log is the console: a warning naming the endpoint and the usual causes
    after 5 s, then, at transport.connect_timeout, the one error line."""
    endpoint = free_endpoint()
    result = zmqrl(
        "actor",
        str(CARTPOLE),
        *sets(
            run__dir=tmp_path,
            transport__samples=free_endpoint(),
            transport__weights=endpoint,
            transport__heartbeat=f"ipc://{tmp_path}/heartbeat",
            transport__control=f"ipc://{tmp_path}/control",
            transport__connect_timeout=6,
        ),
    )
    line = last_line(result, EXIT_RUNTIME)
    assert line.startswith(f"error: no weights received from {endpoint} for 6 s (transport.connect_timeout)")
    assert "firewall" in line and "transport.key_name" in line
    warnings = [ln for ln in result.stderr.splitlines() if " WARNING actor-0 zmqrl.actor: " in ln]
    assert len(warnings) == 1, result.stderr
    assert f"no weights from the learner at {endpoint} (transport.weights) after 5 s" in warnings[0]
    assert "is the learner running there? a firewall in between?" in warnings[0]
    assert "Curve keys" in warnings[0] and "transport.connect_timeout=6 s" in warnings[0]


@pytest.mark.parametrize(
    "command", ["launch", "launch --serial", "learner", "actor", "evaluator", "supervise"]
)
def test_a_run_dir_that_cannot_be_made_is_one_line_before_anything_starts(
    tmp_path: Path, command: str
) -> None:
    """A file where the run's folder would go was a traceback from the first write (the supervisor's
    token, a role's config.yaml or its id's lock)."""
    blocker = tmp_path / "afile"
    blocker.write_text("")
    args = [*command.split(), *launch(tmp_path)[1:], *sets(run__dir=blocker)]  # the later --set wins
    done = zmqrl(*args)
    line = only_line(done, EXIT_CONFIG) if command.startswith("launch") else last_line(done, EXIT_CONFIG)
    assert line == (
        f"error: run.dir: cannot make {blocker / 't'}: {blocker} is a file, not a folder "
        "(choose another run.dir)"
    )


# ---------------------------------------------------------------------- (c) an unknown env id


def test_an_unknown_env_id_offers_the_closest_registered_ids_before_anything_starts(tmp_path: Path) -> None:
    line = only_line(zmqrl(*launch(tmp_path, env__id="CartPol-v1")), EXIT_CONFIG)
    assert line.startswith("error: env.id 'CartPol-v1' could not be made: no such registered gymnasium id")
    assert "did you mean 'CartPole-v1'" in line and "mypackage.envs:make_env" in line
    assert nothing_started(tmp_path)


def test_an_actor_started_by_hand_reports_an_unknown_env_id_the_same_way(tmp_path: Path) -> None:
    args = sets(
        run__dir=tmp_path,
        env__id="CartPol-v1",
        transport__heartbeat=f"ipc://{tmp_path}/heartbeat",
        transport__control=f"ipc://{tmp_path}/control",
    )
    line = last_line(zmqrl("actor", str(CARTPOLE), *args), EXIT_CONFIG)
    assert "env.id 'CartPol-v1'" in line and "did you mean 'CartPole-v1'" in line


# ---------------------------------------------------------------------- messages the learner would drop


@pytest.mark.parametrize(
    ("values", "start"),
    [
        (
            {"actor__send_batch": 50000, "transport__max_message_mb": 1},
            "error: a samples message of actor.send_batch 50000 transitions carries 1.5 MiB of observations",
        ),
        ({"actor__send_batch": 100000}, "error: actor.send_batch 100000 is more than the 65536 transitions"),
    ],
)
def test_a_send_batch_whose_every_message_the_learner_would_drop_is_refused_first(
    tmp_path: Path, values: dict[str, object], start: str
) -> None:
    """Before, the actors ran at full speed while the learner dropped each message as malformed,
    and the run never trained."""
    line = only_line(zmqrl(*launch(tmp_path, **values)), EXIT_CONFIG)
    assert line.startswith(start) and "every one would be dropped; lower actor.send_batch" in line, line
    assert nothing_started(tmp_path)


# ---------------------------------------------------------------------- (d) CUDA asked for, absent


def test_cuda_without_a_gpu_names_the_setting_and_the_alternatives(tmp_path: Path) -> None:
    line = only_line(zmqrl(*launch(tmp_path, agent__device="cuda"), no_cuda=True), EXIT_CONFIG)
    assert line == (
        "error: agent.device: device 'cuda' was requested but torch sees no CUDA device; use 'cpu' or 'auto'"
    )
    assert nothing_started(tmp_path)


def test_a_learner_started_by_hand_with_cuda_and_no_gpu_exits_2(tmp_path: Path) -> None:
    args = sets(
        run__dir=tmp_path,
        agent__device="cuda",
        transport__samples="tcp://127.0.0.1:0",
        transport__weights="tcp://127.0.0.1:0",
        transport__heartbeat=f"ipc://{tmp_path}/heartbeat",
        transport__control=f"ipc://{tmp_path}/control",
    )
    line = last_line(zmqrl("learner", str(CARTPOLE), *args, no_cuda=True), EXIT_CONFIG)
    assert "agent.device" in line and "'cpu' or 'auto'" in line


# ---------------------------------------------------------------------- (e) a missing optional extra


@pytest.mark.parametrize(
    ("env_id", "hidden", "install"),
    [
        ("HalfCheetah-v5", "mujoco", 'pip install "gymnasium[mujoco]"'),
        ("ALE/Pong-v5", "ale_py", 'pip install -e ".[atari]"'),
        ("MinAtar/Breakout-v1", "minatar", "pip install minatar"),
        ("LunarLander-v3", "Box2D", 'pip install swig "gymnasium[box2d]"'),
    ],
    ids=["mujoco", "atari", "minatar", "box2d"],
)
def test_an_env_whose_package_is_missing_says_what_to_install(
    tmp_path: Path, env_id: str, hidden: str, install: str
) -> None:
    extra = ["--set", "env.preprocess=atari"] if env_id.startswith("ALE/") else []
    line = only_line(zmqrl(*launch(tmp_path, *extra, env__id=env_id), hide=(hidden,)), EXIT_CONFIG)
    assert line.startswith(f"error: env.id '{env_id}' needs "), line
    assert f"`{install}`" in line
    assert nothing_started(tmp_path)


# ---------------------------------------------------------------------- (f) the config file


def test_a_config_file_that_does_not_exist_is_named_with_the_closest_names_next_to_it() -> None:
    line = only_line(zmqrl("launch", "configs/cartpole_dq.yaml"), EXIT_CONFIG)
    assert line.startswith("error: configs/cartpole_dq.yaml: config file not found (did you mean ")
    assert "configs/cartpole_dqn.yaml" in line


def test_a_config_path_in_no_directory_says_so(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "run.yaml"
    line = only_line(zmqrl("config", str(missing)), EXIT_CONFIG)
    assert line == f"error: {missing}: config file not found (no directory {missing.parent})"


def test_a_directory_given_as_the_config_says_it_is_one() -> None:
    line = only_line(zmqrl("launch", "configs"), EXIT_CONFIG)
    assert line == (
        "error: configs: is a directory, not a config file; give a YAML file, e.g. configs/cartpole_dqn.yaml"
    )


def test_a_yaml_syntax_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    config = tmp_path / "broken.yaml"
    config.write_text("run:\n  seed: 1\n   name: x\n")
    line = only_line(zmqrl("launch", str(config)), EXIT_CONFIG)
    assert re.fullmatch(
        rf"error: {re.escape(str(config))}: not valid YAML at line 3, column \d+: .+", line
    ), line


def test_resuming_a_directory_that_is_no_run_says_so(tmp_path: Path) -> None:
    line = only_line(zmqrl("launch", "--resume", str(tmp_path)), EXIT_CONFIG)
    assert line == f"error: {tmp_path}: not a run directory (no config.yaml in it); give a runs/NAME"


def test_an_unknown_log_level_is_a_usage_error_listing_the_levels() -> None:
    result = zmqrl("launch", str(CARTPOLE), "--log-level", "loud")
    assert result.returncode == EXIT_CONFIG
    assert "'loud' is not one of" in result.stderr and "--log-level" in result.stderr
    assert all(f"'{level}'" in result.stderr for level in ("debug", "info", "warning", "error"))


def test_a_bind_error_message_names_the_port_setting_and_what_to_do() -> None:
    """The message both binding paths (learner, supervisor) raise, also for IPC endpoints."""
    from zmqrl.transport.sockets import address_in_use_message, tcp_port_taken

    tcp = address_in_use_message("control", "tcp://0.0.0.0:5558")
    assert (
        "(port 5558, setting transport.control)" in tcp
        and "--set transport.control=tcp://0.0.0.0:PORT" in tcp
    )
    ipc = address_in_use_message("heartbeat", "ipc:///tmp/hb")
    assert "(ipc:///tmp/hb, setting transport.heartbeat)" in ipc
    with port_in_use() as taken:
        assert tcp_port_taken(taken)
    for endpoint in ("tcp://127.0.0.1:0", "ipc:///tmp/x", "tcp://eth0:5555", "inproc://a"):
        assert not tcp_port_taken(endpoint), endpoint  # left to the bind itself
