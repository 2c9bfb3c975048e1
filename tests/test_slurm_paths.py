"""Paths and values with line breaks, quotes and shell syntax in the script `zmqrl slurm` writes:
in the body each reaches bash as one word, byte for byte; on an #SBATCH line, where bash's quoting
does not apply (bash reads the line as a comment, sbatch by its own rules), a value that would end
the line is refused, naming the value and what to do. Without Slurm: bash runs the script's start."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO
from zmqrl.cli.app import app
from zmqrl.cli.slurm_script import SlurmJob, render_script

CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
# Where the script stops outside an allocation: everything before it is the settled part.
ALLOCATION_CHECK = ': "${SLURM_JOB_NODELIST:?'


def hostile(tmp_path: Path, name: str) -> str:
    """A path that would run `touch tmp_path/pwned` if any of its parts reached bash unquoted."""
    mark = tmp_path / "pwned"
    return f'{tmp_path}/{name} \'"$(touch {mark})" `touch {mark}`}}\n touch {mark}; ${{HOME}} %j'


def job(tmp_path: Path, **changes: object) -> SlurmJob:
    values: dict[str, object] = {
        "config": Path(hostile(tmp_path, "config.yaml")),
        "run_root": Path(hostile(tmp_path, "runs")),
        "run_dir": Path(hostile(tmp_path, "runs")) / "cart\npole",
        "workdir": tmp_path,
        "python": hostile(tmp_path, "python"),
        "overrides": ["run.name=a\nb'c\"$(touch x)"],
    }
    values.update(changes)
    return SlurmJob(**values)  # type: ignore[arg-type]


def test_paths_in_the_body_reach_bash_as_one_word_each(tmp_path: Path) -> None:
    the_job = job(tmp_path)
    text = render_script(the_job)
    settled = text[: text.index(ALLOCATION_CHECK)]
    script = tmp_path / "start.sh"
    script.write_text(
        settled + 'printf "%s\\0" "$PYTHON" "$CONFIG" "$RUN_ROOT" "$RUN_DIR" "${USER_SETS[@]}"\n'
    )
    env = {"PATH": os.environ["PATH"]}
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr
    words = done.stdout.decode().split("\0")[:-1]
    expected = [the_job.python, str(the_job.config), str(the_job.run_root), str(the_job.run_dir)]
    assert words == [*expected, "--set", the_job.overrides[0]]
    assert not (tmp_path / "pwned").exists()


def test_the_whole_script_runs_no_line_a_path_smuggled_in(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text(render_script(job(tmp_path)))
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    env = {"PATH": os.environ["PATH"]}  # outside an allocation: it stops at the check, exit 1
    done = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, timeout=30)
    assert b"submit this script with sbatch" in done.stderr
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("name", ["runs\ntouch pwned", 'my "runs"', "runs\\x", "runs\x1b[2J"])
def test_a_working_directory_no_sbatch_line_can_hold_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    workdir = tmp_path / name
    workdir.mkdir()
    with pytest.raises(ValueError, match=r"the working directory .*: it holds .* #SBATCH line cannot hold"):
        render_script(job(tmp_path, workdir=workdir))
    monkeypatch.chdir(workdir)
    output = tmp_path / "job.sbatch"
    result = CliRunner().invoke(app, ["slurm", str(CONFIG), "-o", str(output)])
    assert result.exit_code == 2
    assert f"the working directory {str(workdir)!r}: it holds" in result.output
    assert "run zmqrl slurm from a directory" in result.output
    assert not output.exists()


@pytest.mark.parametrize("name", ["my runs", "runs#1", "bob's runs"])
def test_a_working_directory_sbatch_would_split_is_double_quoted(tmp_path: Path, name: str) -> None:
    workdir = tmp_path / name
    assert f'#SBATCH --chdir="{workdir}"\n' in render_script(job(tmp_path, workdir=workdir))


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--time", "1:00:00\x1b"], "--time '1:00:00\\x1b'"),
        (["--partition", 'gpu"'], "--partition 'gpu\"'"),
        (["--sbatch", "--comment=a\rb"], "--sbatch '--comment=a\\rb'"),
    ],
)
def test_a_directive_value_with_a_control_character_or_quote_is_refused(args: list[str], named: str) -> None:
    result = CliRunner().invoke(app, ["slurm", str(CONFIG), *args])
    assert result.exit_code == 2 and "#SBATCH" in result.output
    assert named in result.output
