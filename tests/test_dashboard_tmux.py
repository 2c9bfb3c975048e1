"""The live dashboard in a real terminal (issue 11 item 1): `zmqrl launch` inside tmux, read back
with ``capture-pane``, stopped with Ctrl-C typed into the pane.

The capture is saved to the test's tmp dir as dashboard.txt and printed (``pytest -s`` shows it).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import REPO, processes_mentioning, tiny_overrides, wait_until

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (apt-get install tmux)"),
]
WIDTH, HEIGHT = 110, 40
ROLES = ("learner-0", "actor-0", "actor-1")


class Tmux:
    """One tmux server of our own (``-L``), so nothing touches the user's sessions."""

    def __init__(self) -> None:
        self.socket = f"zmqrl-test-{uuid.uuid4().hex[:12]}"

    def __call__(self, *args: str) -> str:
        done = subprocess.run(["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=10)
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "run")


def test_the_dashboard_draws_in_a_real_terminal_and_ctrl_c_leaves_it_clean(
    run_root: Path, tmp_path: Path
) -> None:
    overrides = tiny_overrides(run_root, learner__max_updates=100_000, actor__num_actors=2)
    launch = [sys.executable, "-m", "zmqrl", "launch", "configs/cartpole_dqn.yaml"]
    for item in overrides:
        launch += ["--set", item]
    exit_file = tmp_path / "exit_code"
    # The shell stays after the launch so the pane (and the summary below the dashboard) can be read.
    # A script file, so that the pane's shell (alive until kill-server) does not carry the run's path
    # on its command line and is not mistaken below for a zmqrl process left behind.
    script = tmp_path / "pane.sh"
    command = f"cd {shlex.quote(str(REPO))} && {shlex.join(launch)}; echo $? > {exit_file}; sleep 60\n"
    script.write_text(command)
    tmux = Tmux()
    try:
        tmux(
            "new-session",
            "-d",
            "-s",
            "run",
            "-x",
            str(WIDTH),
            "-y",
            str(HEIGHT),
            f"bash {shlex.quote(str(script))}",
        )

        def dashboard_up() -> bool:
            screen = tmux.screen()
            return "learner-0" in screen and "actor-1" in screen and re.search(r"\d+%", screen) is not None

        def training() -> bool:
            screen = tmux.screen()
            # An actor held back by the replay ratio shows "blocked": alive, as "running" is.
            alive = all(re.search(rf"{name} .* (running|blocked)", screen) for name in ROLES)
            return alive and re.search(r"updates [1-9]\d*/100000", screen) is not None

        wait_until(dashboard_up, 40, "the dashboard in the pane")
        try:
            wait_until(training, 30, "the learner training and both actors alive")
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}; the pane shows:\n{tmux.screen()}") from None
        live = tmux.screen()
        (tmp_path / "dashboard.txt").write_text(live)
        print(f"\n--- tmux capture-pane ({WIDTH}x{HEIGHT}) while the run goes ---\n{live}")

        tmux("send-keys", "-t", "run", "C-c")
        wait_until(exit_file.is_file, 30, "the launch to exit after Ctrl-C")
        wait_until(lambda: exit_file.read_text().strip() != "", 5, "the exit code written")
        end = tmux.screen()
        (tmp_path / "after_ctrl_c.txt").write_text(end)
        print(f"--- after Ctrl-C ---\n{end}")
    finally:
        tmux("kill-server")
    assert exit_file.read_text().strip() == "130", end
    assert "SIGINT received" in end
    lines = end.splitlines()
    header = max(i for i, line in enumerate(lines) if line.startswith("zmqrl "))
    summary = lines.index("== learner ==")
    assert header < summary, "the last frame stays above the final summary"
    assert "finished" in " ".join(lines[header : header + 2]), "the last frame says so"
    assert "\x1b" not in end
    # launch has exited with 130, so none should be left; the wait only covers /proc catching up.
    wait_until(lambda: processes_mentioning(str(run_root)) == [], 5, "no zmqrl process left")
