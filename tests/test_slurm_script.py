"""The script `zmqrl slurm` writes, without Slurm: its #SBATCH header, and what it does when bash runs
it on a pretend allocation.

Slurm's commands (``scontrol``, ``srun``) and ``getent`` are replaced by small shell scripts on PATH,
and the Python the script calls by one that records its arguments, so each test sees exactly which
roles start where, with which endpoints, and that a --set value reaches every role byte for byte.
tests/test_slurm.py runs the same script on a real one-node Slurm.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO, wait_until
from zmqrl.cli.app import app
from zmqrl.cli.slurm_script import PORT_RANGE_START, PORT_SLOTS, PORT_STRIDE

CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
JOB_ID = 4321
DERIVED_PORT = PORT_RANGE_START + JOB_ID % PORT_SLOTS * PORT_STRIDE

# The stand-ins. Each role's arguments go to $FAKE_LOG/<role>.<n>, NUL-separated; a role runs for
# $FAKE_SLEEP_<role> seconds (default 0; on SIGTERM it exits $FAKE_TERM_EXIT_<role>, default 143),
# then exits $FAKE_EXIT_<role> (default 0); `keys DIR` makes DIR/server.key as the real one would.
FAKE_PYTHON = r"""#!/bin/bash
role=$3
n=0
while [ -e "$FAKE_LOG/$role.$n" ]; do n=$((n + 1)); done
printf '%s\0' "$@" > "$FAKE_LOG/$role.$n"
if [ "$role" = keys ]; then mkdir -p "$4" && touch "$4/server.key"; fi
seconds=FAKE_SLEEP_$role
if [ -n "${!seconds:-}" ]; then
  term=FAKE_TERM_EXIT_$role
  trap 'kill $child; exit "${!term:-143}"' TERM
  sleep "${!seconds}" &
  child=$!
  wait $child
fi
code=FAKE_EXIT_$role
exit "${!code:-0}"
"""
FAKE_SCONTROL = r"""#!/bin/bash
[ "$1 $2 $3" = "show hostnames $SLURM_JOB_NODELIST" ] || exit 9
tr , '\n' <<< "$SLURM_JOB_NODELIST"
"""
FAKE_GETENT = r"""#!/bin/bash
[ "$1" = ahostsv4 ] || exit 9
echo "$FAKE_ADDR      STREAM $2"
"""
FAKE_IP = r"""#!/bin/bash
[ "$1 $2 $3 $4 $5" = "-4 -o addr show dev" ] || exit 9
echo "3: $6    inet $FAKE_IFACE_ADDR/16 brd 10.5.255.255 scope global $6\\       valid_lft forever"
"""
# Records its options and runs the task command once, as rank 0.
FAKE_SRUN = r"""#!/bin/bash
printf '%s\0' "$@" > "$FAKE_LOG/srun"
while [ "$1" != bash ]; do shift; done
SLURM_PROCID=0 exec "$@"
"""


@dataclass
class Job:
    """What a pretend job did."""

    code: int
    output: str
    log: Path

    def args(self, name: str) -> list[str]:
        """The arguments ``name`` (``learner.0``, ``srun``) was run with."""
        return (self.log / name).read_bytes().decode().split("\0")[:-1]

    def started(self) -> list[str]:
        return sorted(p.name for p in self.log.iterdir())


def write_script(tmp_path: Path, *args: str) -> Path:
    script = tmp_path / "job.sbatch"
    runs = ["--set", f"run.dir={tmp_path / 'runs'}"]
    result = CliRunner().invoke(app, ["slurm", str(CONFIG), "--output", str(script), *runs, *args])
    assert result.exit_code == 0, result.output
    return script


def run_job(
    tmp_path: Path,
    script: Path,
    nodes: list[str],
    address: str,
    during: Callable[[subprocess.Popen[str], Path], None] | None = None,
    submitted_with: dict[str, str] | None = None,
    **fake: str,
) -> Job:
    """Runs ``script`` with bash as Slurm would on an allocation of ``nodes``, whose first node's
    name resolves to ``address`` there; ``fake``: FAKE_ variables (``EXIT_learner="1"``);
    ``during(job, log)``: what to do while it runs; ``submitted_with``: the user's environment."""
    fakes = tmp_path / "bin"
    fakes.mkdir(exist_ok=True)
    for name, text in {
        "python": FAKE_PYTHON,
        "scontrol": FAKE_SCONTROL,
        "getent": FAKE_GETENT,
        "srun": FAKE_SRUN,
        "ip": FAKE_IP,
    }.items():
        (fakes / name).write_text(text)
        (fakes / name).chmod(0o755)
    log = tmp_path / "log"
    log.mkdir()
    env = {
        "PATH": f"{fakes}:{os.environ['PATH']}",
        "ZMQRL_PYTHON": str(fakes / "python"),
        "SLURM_JOB_ID": str(JOB_ID),
        "SLURM_JOB_NODELIST": ",".join(nodes),
        "SLURM_JOB_NUM_NODES": str(len(nodes)),
        "FAKE_ADDR": address,
        "FAKE_LOG": str(log),
        **{f"FAKE_{name}": value for name, value in fake.items()},
        **(submitted_with or {}),
    }
    with subprocess.Popen(
        ["bash", str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as job:
        try:
            if during is not None:
                during(job, log)
            output, _ = job.communicate(timeout=60)
        finally:
            job.kill()
    return Job(job.returncode, output, log)


def sets(args: list[str]) -> dict[str, str]:
    """The ``--set KEY=VALUE`` pairs among ``args`` (the last one of a key wins, as in the config)."""
    pairs = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
    return {p.partition("=")[0]: p.partition("=")[2] for p in pairs}


def test_the_header_asks_for_the_allocation_the_options_describe(tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        *("--nodes", "3", "--actors-per-node", "4", "--cpus-per-actor", "2", "--time", "1:30:00"),
        *("--partition", "cpu", "--sbatch=--account=rl", "--set", "run.name=cart"),
    )
    header = [line for line in script.read_text().splitlines() if line.startswith("#SBATCH")]
    assert header == [
        "#SBATCH --job-name=zmqrl-cart",
        "#SBATCH --nodes=3",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --cpus-per-task=2",
        f"#SBATCH --chdir={Path.cwd()}",
        "#SBATCH --signal=B:TERM@120",
        "#SBATCH --time=1:30:00",
        "#SBATCH --partition=cpu",
        "#SBATCH --account=rl",
    ]
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0


def test_a_working_directory_with_spaces_is_quoted_for_sbatch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    workdir = tmp_path / "my runs"
    workdir.mkdir()
    monkeypatch.chdir(workdir)
    script = write_script(tmp_path)
    assert f'#SBATCH --chdir="{workdir}"\n' in script.read_text()


def test_learner_and_supervisor_run_on_the_first_node_and_actors_on_the_others(tmp_path: Path) -> None:
    script = write_script(tmp_path, "--nodes", "3", "--actors-per-node", "2")
    job = run_job(tmp_path, script, ["n7", "n8", "n9"], "10.1.2.3")
    assert job.code == 0, job.output
    assert job.started() == ["actor.0", "keys.0", "learner.0", "srun", "supervise.0"]
    learner = job.args("learner.0")
    assert learner[:4] == ["-m", "zmqrl", "learner", str(CONFIG)]
    expected = {
        "transport.samples": f"tcp://10.1.2.3:{DERIVED_PORT}",
        "transport.weights": f"tcp://10.1.2.3:{DERIVED_PORT + 1}",
        "transport.heartbeat": f"tcp://10.1.2.3:{DERIVED_PORT + 2}",
        "transport.control": f"tcp://10.1.2.3:{DERIVED_PORT + 3}",
        "supervisor.metrics_http": f"127.0.0.1:{DERIVED_PORT + 4}",
        "actor.num_actors": "4",  # 2 actor nodes x 2
        "run.dir": str(tmp_path / "runs"),
        "transport.keys_dir": str(tmp_path / "runs" / "cartpole_dqn" / "keys"),
    }
    for role in ("learner.0", "supervise.0", "actor.0"):
        assert expected.items() <= sets(job.args(role)).items(), role
    assert "--plain" in job.args("supervise.0")
    srun = job.args("srun")
    options = srun[: srun.index("bash")]
    assert options == [
        "--nodes=2",
        "--ntasks=4",
        "--ntasks-per-node=2",
        "--cpus-per-task=1",
        "--exclude=n7",
        "--kill-on-bad-exit=0",
        f"--output={tmp_path / 'runs' / 'cartpole_dqn' / 'logs' / 'actor-%t.log'}",
    ]
    assert job.args("actor.0")[-2:] == ["--id", "0"]  # the task's rank
    assert "run ended with 0" in job.output


def test_one_node_runs_the_actors_beside_the_learner(tmp_path: Path) -> None:
    script = write_script(tmp_path, "--nodes", "1", "--actors-per-node", "3", "--port-base", "6000")
    job = run_job(tmp_path, script, ["solo"], "10.0.0.5")
    assert job.code == 0, job.output
    srun = job.args("srun")
    assert {"--nodes=1", "--ntasks=3", "--nodelist=solo"} <= set(srun[: srun.index("bash")])
    assert sets(job.args("actor.0"))["transport.samples"] == "tcp://10.0.0.5:6000"
    assert sets(job.args("actor.0"))["actor.num_actors"] == "3"


def test_a_set_value_reaches_every_role_exactly(tmp_path: Path) -> None:
    tricky = 'it\'s a "run" $HOME `id` \\ ; *'
    script = write_script(tmp_path, "--nodes", "2", "--set", f"run.name={tricky}", "--set", "agent.lr=0.002")
    job = run_job(tmp_path, script, ["a1", "a2"], "10.9.9.9")
    assert job.code == 0, job.output
    for role in ("learner.0", "supervise.0", "actor.0"):
        assert sets(job.args(role))["run.name"] == tricky, role
        assert sets(job.args(role))["agent.lr"] == "0.002", role
    assert (tmp_path / "runs" / tricky / "logs").is_dir()  # the script's own use of the name
    assert re.search(r"^#SBATCH --job-name=zmqrl-it_s_a__run__[\w.-]+$", script.read_text(), re.M)


def test_several_nodes_refuse_a_first_node_that_resolves_to_loopback(tmp_path: Path) -> None:
    script = write_script(tmp_path, "--nodes", "2")
    job = run_job(tmp_path, script, ["h1", "h2"], "127.0.1.1")
    assert job.code == 2
    assert "h1 resolves to 127.0.1.1 (loopback)" in job.output and "ZMQRL_ADDRESS" in job.output
    assert job.started() == []


def test_an_address_given_at_submission_is_taken_as_it_is(tmp_path: Path) -> None:
    # several slurmd on one host (as tests/test_slurm.py runs two) share its loopback
    script = write_script(tmp_path, "--nodes", "2")
    given = {"ZMQRL_ADDRESS": "127.0.0.1"}
    job = run_job(tmp_path, script, ["h1", "h2"], "127.0.1.1", submitted_with=given)
    assert job.code == 0, job.output
    assert sets(job.args("actor.0"))["transport.control"] == f"tcp://127.0.0.1:{DERIVED_PORT + 3}"


def test_the_job_exits_with_the_learners_code_when_it_did_not_finish(tmp_path: Path) -> None:
    script = write_script(tmp_path, "--nodes", "1", "--set", "supervisor.stop_grace=1")
    job = run_job(tmp_path, script, ["solo"], "127.0.0.1", EXIT_learner="1")
    assert job.code == 1, job.output
    assert "learner exited 1" in job.output and "run ended with 1 (learner 1" in job.output


def test_a_supervisor_that_refuses_to_run_gives_the_job_its_code(tmp_path: Path) -> None:
    # e.g. a second run on a finished run directory: supervise exits 2; the learner, left without
    # a supervisor, leaves by itself (here after 1 s)
    script = write_script(tmp_path, "--nodes", "1", "--set", "supervisor.stop_grace=1")
    job = run_job(tmp_path, script, ["solo"], "127.0.0.1", EXIT_supervise="2", SLEEP_learner="1")
    assert job.code == 2, job.output
    assert "run ended with 2 (learner 0, supervisor 2" in job.output


def test_a_stop_request_stops_the_supervisor_and_the_job_exits_143(tmp_path: Path) -> None:
    # Slurm signals the batch shell before the time limit (#SBATCH --signal=B:TERM@...): the script
    # stops the supervisor (which broadcasts stop; a stopped supervise exits 0), the learner leaves
    def stop_once_running(job: subprocess.Popen[str], log: Path) -> None:
        wait_until(lambda: (log / "learner.0").exists() and (log / "srun").exists(), 30, "the roles")
        job.send_signal(signal.SIGTERM)

    script = write_script(tmp_path, "--nodes", "1", "--set", "supervisor.stop_grace=1")
    job = run_job(
        tmp_path,
        script,
        ["solo"],
        "127.0.0.1",
        during=stop_once_running,
        SLEEP_learner="2",
        SLEEP_supervise="30",
        TERM_EXIT_supervise="0",
    )
    assert job.code == 143, job.output
    assert "stop requested" in job.output and "learner 0, supervisor 0" in job.output


def test_the_evaluator_runs_beside_the_learner_when_enabled(tmp_path: Path) -> None:
    script = write_script(tmp_path, "--nodes", "2", "--set", "evaluator.enabled=true")
    job = run_job(tmp_path, script, ["h1", "h2"], "10.1.1.1")
    assert job.code == 0, job.output
    evaluator = job.args("evaluator.0")
    assert evaluator[2:5] == ["evaluator", str(CONFIG), "--resume"]
    assert sets(evaluator)["transport.weights"] == f"tcp://10.1.1.1:{DERIVED_PORT + 1}"
    assert job.args("learner.0")[4] == "--resume"  # a resubmitted job continues


def test_the_address_can_come_from_an_interface_or_the_environment(tmp_path: Path) -> None:
    script = write_script(tmp_path, "--nodes", "2", "--interface", "ib0")
    job = run_job(tmp_path, script, ["h1", "h2"], "10.1.1.1", IFACE_ADDR="10.5.0.7")
    assert job.code == 0, job.output
    assert sets(job.args("actor.0"))["transport.samples"] == f"tcp://10.5.0.7:{DERIVED_PORT}"
    (tmp_path / "log").rename(tmp_path / "first")
    override = {"ZMQRL_ADDRESS": "10.6.6.6"}
    job = run_job(tmp_path, script, ["h1", "h2"], "10.1.1.1", submitted_with=override, IFACE_ADDR="10.5.0.7")
    assert sets(job.args("learner.0"))["transport.samples"] == f"tcp://10.6.6.6:{DERIVED_PORT}"


def test_outside_a_job_the_script_says_to_submit_it(tmp_path: Path) -> None:
    script = write_script(tmp_path)
    done = subprocess.run(
        ["bash", str(script)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True
    )
    assert done.returncode != 0 and "submit this script with sbatch" in done.stderr


def test_insecure_makes_no_keys_and_gives_the_token_to_the_supervisor_and_each_role_its_key(
    tmp_path: Path,
) -> None:
    script = write_script(tmp_path, "--nodes", "2", "--insecure")
    job = run_job(tmp_path, script, ["h1", "h2"], "10.1.1.1")
    assert job.code == 0, job.output
    assert "keys.0" not in job.started()
    supervisor = sets(job.args("supervise.0"))
    assert supervisor["transport.control_token_file"].endswith("/cartpole_dqn/control.token")
    for role in ("learner.0", "actor.0"):
        given = sets(job.args(role))
        assert given["transport.insecure"] == "true"
        assert given["transport.control_keys_dir"].endswith("/cartpole_dqn/control-keys")
        assert "transport.control_token_file" not in given, "roles never hold the run's token"
        assert "transport.keys_dir" not in given


def test_a_chosen_metrics_address_is_kept(tmp_path: Path) -> None:
    script = write_script(tmp_path, "--set", "supervisor.metrics_http=0.0.0.0:9100")
    assert "supervisor.metrics_http=127.0.0.1" not in script.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "transport.samples=tcp://1.2.3.4:5"], "--set transport.samples: the script sets it"),
        (["--set", "transport.keys_dir=/k"], "--set transport.keys_dir: the script sets it"),
        (["--time", "1:00:00\nrm -rf ~"], "no spaces, line breaks or control characters"),
        (["--sbatch", "account=x"], "give an sbatch option"),
    ],
)
def test_bad_options_exit_2_with_one_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["slurm", str(CONFIG), *args])
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_without_output_the_script_is_printed() -> None:
    result = CliRunner().invoke(app, ["slurm", str(CONFIG), "--nodes", "4"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("#!/bin/bash\n")
    assert "#SBATCH --nodes=4" in result.stdout
