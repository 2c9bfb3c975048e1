"""Two ``zmqrl tune`` processes sharing one study on a real PostgreSQL server, as tuners on two
hosts would: every trial is run by exactly one of them, and together they end the number asked.

The server is Debian's (``apt-get install postgresql``; .ci/run installs it), started here on
loopback with its data in a temporary directory and stopped whatever happens. Debian keeps the
server's programs off PATH, under /usr/lib/postgresql/VERSION/bin. PostgreSQL refuses to run as
root, so under root the server runs as the ``postgres`` user the package creates.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, processes_mentioning, tiny_overrides, wait_until
from tests.test_slurm import free_port

pytestmark = [pytest.mark.slow, pytest.mark.heavy]
optuna = pytest.importorskip("optuna", reason="zmqrl tune needs the tune extra: pip install 'zmqrl[tune]'")
psycopg = pytest.importorskip("psycopg", reason="PostgreSQL's driver: pip install 'zmqrl[tune-postgres]'")
from optuna.trial import TrialState  # noqa: E402

CONFIG = REPO / "configs" / "cartpole_dqn.yaml"
SPACE = """\
objective: {metric: auc}
pruner: {kind: median, startup_trials: 2, warmup_evaluations: 1}
params:
  agent.lr: {float: [0.001, 0.01], log: true}
  agent.n_step: {int: [1, 3]}
"""
TRIALS = 4
TUNERS = 2
SERVER_UP_S = 60.0
TUNE_DEADLINE_S = 300.0


def server_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A throwaway PostgreSQL on 127.0.0.1: the URL of its ``postgres`` database, user ``zmqrl``."""
    bindir = server_bin()
    if bindir is None:
        pytest.skip("PostgreSQL's server is not installed: apt-get install postgresql")
    run_as: dict[str, Any] = {}
    if os.geteuid() == 0:
        try:
            run_as = {"user": pwd.getpwnam("postgres").pw_uid}
        except KeyError:
            pytest.skip("running as root and there is no postgres user to run the server as")
    data = Path(tempfile.mkdtemp(prefix="zmqrl-pg-"))
    if run_as:
        os.chown(data, run_as["user"], -1)
    server: subprocess.Popen[bytes] | None = None
    try:
        subprocess.run(
            [bindir / "initdb", "-D", data / "db", "-U", "zmqrl", "--auth=trust", "--no-sync"],
            check=True,
            capture_output=True,
            **run_as,
        )
        port = free_port()
        server = subprocess.Popen(
            [bindir / "postgres", "-D", data / "db", "-h", "127.0.0.1", "-p", str(port), "-k", data / "db"],
            stdout=subprocess.DEVNULL,
            stderr=(data / "server.log").open("wb"),
            **run_as,
        )
        url = f"postgresql://zmqrl@127.0.0.1:{port}/postgres"
        wait_until(lambda: accepts(url) or server.poll() is not None, SERVER_UP_S, "PostgreSQL to accept")
        assert server.poll() is None, (data / "server.log").read_text()
        yield url
    finally:
        if server is not None:
            server.send_signal(signal.SIGINT)  # "fast" shutdown: ends the sessions, then the server
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        shutil.rmtree(data, ignore_errors=True)


def accepts(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.OperationalError:
        return False
    return True


def test_two_tuners_share_one_study_and_every_trial_is_run_once(tmp_path: Path, postgres_url: str) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(SPACE)
    dirs = [tmp_path / f"host{i}" for i in range(TUNERS)]
    tuners = []
    try:
        for tune_dir in dirs:  # each as if on its own host: its own tune dir, the same study
            cmd = [sys.executable, "-m", "zmqrl", "tune", str(CONFIG), "--space", str(space), "--serial"]
            cmd += [
                "--trials",
                str(TRIALS),
                "--dir",
                str(tune_dir),
                "--study",
                "shared",
                "--storage",
                postgres_url,
            ]
            for item in tiny_overrides(tune_dir):
                cmd += ["--set", item]
            tuners.append(
                subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            )
        outputs = [tuner.communicate(timeout=TUNE_DEADLINE_S)[0] for tuner in tuners]
    finally:
        for tuner in tuners:
            with contextlib.suppress(ProcessLookupError):
                tuner.kill()
    for tuner, output in zip(tuners, outputs, strict=True):
        assert tuner.returncode == 0, output
    assert (
        "postgresql+psycopg://zmqrl@127.0.0.1" in outputs[0]
    )  # the URL is printed, never a password (none here)

    trials = optuna.load_study(study_name="shared", storage=postgres_url).get_trials()
    states = [t.state for t in trials]
    assert all(state in (TrialState.COMPLETE, TrialState.PRUNED) for state in states), states
    # Each tuner starts a trial only while fewer than N have ended or are running; two that look
    # at the same moment may both start one, so the study may end with one more, never fewer.
    assert TRIALS <= len(trials) <= TRIALS + TUNERS - 1

    started = [set(map(int, re.findall(r"^trial (\d+) started", out, re.M))) for out in outputs]
    assert all(started), "both tuners ran trials"
    assert started[0].isdisjoint(started[1]) and started[0] | started[1] == {t.number for t in trials}
    for numbers, tune_dir in zip(started, dirs, strict=True):
        assert {int(p.name[6:]) for p in (tune_dir / "trials").glob("trial-????")} == numbers
    assert all((tune_dir / "results.md").exists() for tune_dir in dirs)
    assert not processes_mentioning(str(tmp_path))
