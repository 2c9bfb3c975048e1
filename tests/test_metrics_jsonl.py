"""metrics.jsonl: one strict-JSON row per scalar, shared by a run's processes without interleaving,
and a logger whose failures never reach the role that logs."""

from __future__ import annotations

import logging
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from zmqrl import metrics
from zmqrl.metrics import METRICS_FILE, read_metrics, run_logger
from zmqrl.strictjson import loads_strict


def test_a_row_says_who_wrote_what_at_which_step_and_when(tmp_path: Path) -> None:
    launched = time.time() - 100.0
    logger = run_logger(tmp_path, "learner", launched=launched)
    logger.scalar("charts/eval_return", 431.25, 12000)
    logger.close()
    (line,) = (tmp_path / METRICS_FILE).read_text().splitlines()
    row = loads_strict(line)
    assert set(row) == {"source", "tag", "step", "value", "time", "wall"}
    assert (row["source"], row["tag"], row["step"], row["value"]) == (
        "learner",
        "charts/eval_return",
        12000,
        431.25,
    )
    assert 100.0 <= row["time"] < 110.0 and row["wall"] == pytest.approx(launched + row["time"], abs=0.01)


def test_a_value_not_measured_is_null_and_the_row_kept(tmp_path: Path) -> None:
    logger = run_logger(tmp_path, "learner")
    for value in (math.nan, math.inf, 1.5):
        logger.scalar("replay/samples_per_insert", value, 3)
    logger.close()
    rows = [loads_strict(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["value"] for r in rows] == [None, None, 1.5]


def test_learner_events_go_under_tb_and_other_roles_under_their_own_dir(tmp_path: Path) -> None:
    for source in ("learner", "evaluator", "supervisor"):
        logger = run_logger(tmp_path, source)
        logger.scalar("charts/eval_return", 1.0, 1)
        logger.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    assert list((tmp_path / "tb" / "evaluator").glob("events.out.tfevents.*"))
    assert list((tmp_path / "tb" / "supervisor").glob("events.out.tfevents.*"))
    assert {r["source"] for r in read_metrics(tmp_path / METRICS_FILE)} == {
        "learner",
        "evaluator",
        "supervisor",
    }


WRITER = """
import sys
from pathlib import Path
from zmqrl.metrics import MetricsFile, metrics_row
out = MetricsFile(Path(sys.argv[1]))
name, rows = sys.argv[2], int(sys.argv[3])
tag = "perf/" + name * 300  # long rows: a torn write would show
for i in range(rows):
    out.write(metrics_row(name, tag, i, i, launched=0.0, wall=1.0))
out.close()
"""


def test_rows_appended_by_several_processes_at_once_never_interleave(tmp_path: Path) -> None:
    path = tmp_path / METRICS_FILE
    rows = 3000
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(path), name, str(rows)], env=env)
        for name in ("a", "b", "c")
    ]
    for proc in procs:
        assert proc.wait(timeout=60) == 0
    lines = path.read_text().splitlines()
    assert len(lines) == 3 * rows
    parsed = [loads_strict(line) for line in lines]  # a torn or interleaved row would not parse
    for name in ("a", "b", "c"):
        mine = [r for r in parsed if r["source"] == name]
        assert [r["step"] for r in mine] == list(range(rows)) and all(
            r["tag"] == "perf/" + name * 300 for r in mine
        )


def test_a_run_directory_that_cannot_be_written_leaves_the_role_running(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the run directory should be")
    with caplog.at_level(logging.WARNING, "zmqrl.metrics"):
        logger = run_logger(blocked, "learner")
        for step in range(5):
            logger.scalar("losses/loss", 1.0, step)
        logger.flush()
        logger.close()
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 2, warnings  # once for metrics.jsonl, once for TensorBoard
    assert any("metrics.jsonl" in w for w in warnings) and any("tensorboard" in w for w in warnings)


def test_a_failing_write_is_reported_once_and_later_rows_still_go_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    logger = run_logger(tmp_path, "learner")
    real_write = os.write
    failing = {"on": True}

    def write(fd: int, data: bytes) -> int:
        if failing["on"]:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(metrics.os, "write", write)
    with caplog.at_level(logging.WARNING, "zmqrl.metrics"):
        for step in range(3):
            logger.scalar("losses/loss", 1.0, step)
        failing["on"] = False  # space was freed
        logger.scalar("losses/loss", 2.0, 3)
    logger.close()
    assert sum("No space left" in r.getMessage() for r in caplog.records) == 1
    assert [r["step"] for r in read_metrics(tmp_path / METRICS_FILE)] == [3]


def test_a_tag_outside_the_namespaces_is_warned_about_once_and_still_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    logger = run_logger(tmp_path, "evaluator")
    with caplog.at_level(logging.WARNING, "zmqrl.metrics"):
        logger.scalar("evaluator/weights_version", 1, 1)
        logger.scalar("evaluator/weights_version", 2, 2)
    logger.close()
    assert sum("outside the namespaces" in r.getMessage() for r in caplog.records) == 1
    assert len(list(read_metrics(tmp_path / METRICS_FILE))) == 2


def test_the_supervisors_logger_never_imports_torch(tmp_path: Path) -> None:
    code = (
        "import sys; from pathlib import Path; from zmqrl.metrics import run_logger\n"
        f"log = run_logger(Path({str(tmp_path)!r}), 'supervisor'); log.scalar('supervisor/restarts', 0, 0)\n"
        "log.close(); assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr.decode()
    assert list((tmp_path / "tb" / "supervisor").glob("events.out.tfevents.*"))


def test_a_row_cut_short_by_a_crash_is_skipped_by_readers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / METRICS_FILE
    logger = run_logger(tmp_path, "learner")
    logger.scalar("losses/loss", 1.0, 1)
    logger.close()
    with path.open("a") as f:
        f.write('{"source": "learner", "tag": "losses/lo')  # the process died mid-row
    with caplog.at_level(logging.WARNING, "zmqrl.metrics"):
        rows = list(read_metrics(path))
    assert [r["step"] for r in rows] == [1]
    assert any("skipped 1 malformed" in r.getMessage() for r in caplog.records)
