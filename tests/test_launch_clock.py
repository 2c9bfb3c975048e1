"""What a process's reported seconds count from: the launch's start when `zmqrl launch` started it,
its own start when started by hand. A moment taken after imports made a hand-started learner's
start-up marks negative ("bound": -1.2 s, "imported": -0.03 s in its stats)."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from zmqrl.runtime.launched import LAUNCHED_ENV, launch_time, process_started


def test_a_process_start_is_read_from_the_kernel_not_taken_when_asked() -> None:
    code = (
        "import time; time.sleep(0.5)\n"
        "from zmqrl.runtime.launched import process_started\n"
        "print(time.time() - process_started())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert 0.5 <= float(done.stdout) < 30, "the age counts the sleep and the imports before the call"
    assert process_started() <= time.time()


def test_a_launched_process_counts_from_the_launch_and_one_by_hand_says_it_counts_from_its_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(LAUNCHED_ENV, "1234.5")
    assert launch_time() == 1234.5
    monkeypatch.delenv(LAUNCHED_ENV)
    with caplog.at_level(logging.INFO):
        started = launch_time(logging.getLogger("zmqrl.test"))
    assert started == pytest.approx(process_started(), abs=0.05)
    assert "started by hand: reported seconds count from this process's start" in caplog.text
