"""Experiment trackers as the run logger's sinks, without network: W&B offline writes its run
directory with the scalars, MLflow a local file store read back with its own client, a missing
extra is one line naming the pip command, and a tracker that fails never stops the run."""

from __future__ import annotations

import json
import logging
import os
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import tiny_config, wait_until
from zmqrl.config import Config
from zmqrl.errors import ConfigError
from zmqrl.metrics import METRICS_FILE, read_metrics, run_logger
from zmqrl.metrics.trackers import TrackerMissing, flatten, logging_problem

# A .wandb file is a LevelDB-style log: a 7-byte file header, then 32 KiB blocks of records, each a
# 7-byte header (crc32c, length, type) and a slice of one protobuf Record.
WANDB_HEADER = 7
WANDB_BLOCK = 32768
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> Iterator[Any]:
    """The protobuf Records of a .wandb file, read with wandb's own message types."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B log"
    pos, pending = WANDB_HEADER, b""
    while pos + 7 <= len(data):
        left = WANDB_BLOCK - pos % WANDB_BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero padding to the block's end
            pos += left
            continue
        body = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        pending = body if kind in (FULL, FIRST) else pending + body
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            yield record


def wandb_key(item: Any) -> str:
    """An item's key: W&B stores a key with "/" as its parts (nested_key), others as ``key``."""
    return str(item.key) if item.key else "/".join(item.nested_key)


def wandb_history(path: Path) -> list[dict[str, Any]]:
    rows = []
    for record in wandb_records(path):
        if record.WhichOneof("record_type") == "history":
            rows.append({wandb_key(item): json.loads(item.value_json) for item in record.history.item})
    return rows


def wandb_core_of_this_process() -> list[int]:
    """wandb's helper processes started for this process (it passes them our pid)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(a.endswith(b"wandb-core") for a in args) and str(os.getpid()).encode() in args:
                found.append(int(entry.name))
    return found


def tracked(run_dir: Path, **logging_values: object) -> Config:
    return tiny_config(
        run_dir.parent, run__name=run_dir.name, **{f"logging__{k}": v for k, v in logging_values.items()}
    )


@pytest.fixture
def offline_wandb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_RUN_GROUP"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-dir"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path / "runs" / "cart"


def test_wandb_offline_writes_the_scalars_in_its_run_directory_and_leaves_nothing_running(
    offline_wandb: Path,
) -> None:
    run_dir = offline_wandb
    cfg = tracked(run_dir, backends="[wandb]", wandb_mode="offline", project="zmqrl-test")
    logger = run_logger(run_dir, "learner", config=cfg)
    for step in (100, 200, 300):
        logger.scalar("charts/eval_return", step / 8, step)
        logger.scalar("losses/td_loss", 0.5, step)
    logger.scalar("learner/updates_per_s", float("nan"), 300)  # not measured: no point in W&B
    logger.scalar("perf/sps", 1234.5, 7)  # another x-axis, stepping back
    logger.close()

    (log_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    rows = wandb_history(log_file)
    returns = [(r["step"], r["charts/eval_return"]) for r in rows if "charts/eval_return" in r]
    assert returns == [(100, 12.5), (200, 25.0), (300, 37.5)]
    assert all(r["losses/td_loss"] == 0.5 for r in rows if "charts/eval_return" in r)
    assert [(r["step"], r["perf/sps"]) for r in rows if "perf/sps" in r] == [(7, 1234.5)]
    assert not any("learner/updates_per_s" in r for r in rows)
    (run,) = [r.run for r in wandb_records(log_file) if r.WhichOneof("record_type") == "run"]
    assert (run.display_name, run.run_group, run.job_type, run.project) == (
        "cart-learner",
        "cart",
        "learner",
        "zmqrl-test",
    )
    config = {wandb_key(item): json.loads(item.value_json) for item in run.config.update}
    assert config["run"]["name"] == "cart" and config["logging"]["backends"] == ["wandb"]
    assert not list((run_dir / "tb").glob("*")), "tensorboard was not named"
    assert [r["tag"] for r in read_metrics(run_dir / METRICS_FILE)][:2] == [
        "charts/eval_return",
        "losses/td_loss",
    ]
    wait_until(lambda: not wandb_core_of_this_process(), 10.0, "wandb's helper process to exit")


def test_a_callers_own_wandb_run_is_neither_written_to_nor_ended(offline_wandb: Path) -> None:
    import wandb

    run_dir = offline_wandb
    own = wandb.init(project="mine", dir=str(run_dir.parent), mode="offline")
    try:
        cfg = tracked(run_dir, backends="[wandb]", wandb_mode="offline")
        logger = run_logger(run_dir, "learner", config=cfg)
        logger.scalar("charts/eval_return", 5.0, 1)
        logger.close()
        assert wandb.run is own
        own.log({"mine": 1.0})  # still open, and still the caller's
    finally:
        own.finish()
        wandb.teardown()
    (ours,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    assert [r["charts/eval_return"] for r in wandb_history(ours)] == [5.0]
    (theirs,) = (run_dir.parent / "wandb").glob("offline-run-*/run-*.wandb")
    assert [r["mine"] for r in wandb_history(theirs)] == [1.0]
    wait_until(lambda: not wandb_core_of_this_process(), 10.0, "wandb's helper process to exit")


def test_wandb_online_without_an_api_key_goes_on_without_it_and_never_prompts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_BASE_URL", "NETRC"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc, no saved login
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "home" / "wandb"))
    run_dir = tmp_path / "runs" / "cart"
    with caplog.at_level(logging.WARNING, logger="zmqrl.metrics"):
        logger = run_logger(run_dir, "learner", config=tracked(run_dir, backends="[wandb]"))
        logger.scalar("charts/eval_return", 3.0, 10)
        logger.close()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("learner: cannot write wandb metrics (") and "API key" in warning
    assert [r["value"] for r in read_metrics(run_dir / METRICS_FILE)] == [3.0]
    wait_until(lambda: not wandb_core_of_this_process(), 10.0, "wandb's helper process to exit")


def mlflow_client(uri: str) -> Any:
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def test_mlflow_logs_each_role_as_a_run_of_the_project_in_a_file_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = (tmp_path / "store").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9/not-this-one")  # the setting wins
    run_dir = tmp_path / "runs" / "cart"
    cfg = tracked(run_dir, backends="[tensorboard, mlflow]", mlflow_tracking_uri=store, project="proj")
    for source, scale in (("learner", 1.0), ("evaluator", 10.0)):
        logger = run_logger(run_dir, source, config=cfg)
        for step in range(5):
            logger.scalar("charts/eval_return", scale * step, step * 50)
        logger.scalar("charts/eval_return", float("inf"), 999)
        logger.close()

    client = mlflow_client(store)
    experiment = client.get_experiment_by_name("proj")
    runs = client.search_runs([experiment.experiment_id], filter_string="tags.`zmqrl.run` = 'cart'")
    by_source = {run.data.tags["zmqrl.source"]: run for run in runs}
    assert set(by_source) == {"learner", "evaluator"}
    for source, scale in (("learner", 1.0), ("evaluator", 10.0)):
        run = by_source[source]
        assert run.info.run_name == f"cart-{source}" and run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "charts/eval_return")
        assert sorted((m.step, m.value) for m in history) == [(s * 50, scale * s) for s in range(5)]
        assert run.data.params["run.name"] == "cart"
        assert run.data.params["logging.backends"] == "['tensorboard', 'mlflow']"
    assert list((run_dir / "tb").glob("events.out.tfevents.*")), "tensorboard was named too"


def test_mlflow_without_a_uri_uses_the_environment_then_the_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from zmqrl.metrics.mlflow_sink import tracking_uri

    run_dir = tmp_path / "runs" / "cart"
    cfg = tracked(run_dir, backends="[mlflow]")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracker.example:5000")
    assert tracking_uri(cfg.logging, run_dir) == "http://tracker.example:5000"
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    assert tracking_uri(cfg.logging, run_dir) == (run_dir / "mlruns").resolve().as_uri()
    logger = run_logger(run_dir, "supervisor", config=cfg)
    logger.scalar("supervisor/restarts", 2.0, 40)
    logger.close()
    client = mlflow_client((run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("zmqrl").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "supervisor/restarts")] == [
        (40, 2.0)
    ]


@pytest.mark.parametrize("backend", ["wandb", "mlflow"])
def test_a_named_tracker_not_installed_stops_the_role_with_the_pip_command(
    backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, backend, None)  # what an environment without the extra sees
    run_dir = tmp_path / "runs" / "cart"
    cfg = tracked(run_dir, backends=f"[tensorboard, {backend}]")
    with pytest.raises(TrackerMissing) as caught:
        run_logger(run_dir, "learner", config=cfg)
    message = str(caught.value)
    assert isinstance(caught.value, ConfigError) and "\n" not in message
    assert message == (
        f"logging.backends names {backend}, but the {backend} package is not installed: "
        f"pip install 'zmqrl[{backend}]'"
    )
    assert not (run_dir / METRICS_FILE).exists(), "nothing is opened before the check"


def test_an_unknown_backend_or_wandb_mode_is_a_config_problem_naming_the_key(tmp_path: Path) -> None:
    cfg = tracked(tmp_path / "cart")
    assert logging_problem(cfg) is None
    cfg.logging.backends = ["tensorboard", "neptune"]
    assert logging_problem(cfg) == (
        "logging.backends: unknown backend 'neptune'; choose from tensorboard, wandb, mlflow"
    )
    cfg.logging.backends = ["wandb"]
    cfg.logging.wandb_mode = "disabled"
    assert logging_problem(cfg) == "logging.wandb_mode must be one of online, offline, not 'disabled'"


class BrokenTracker:
    name = "mlflow"

    def __init__(self) -> None:
        self.calls = 0

    def scalar(self, tag: str, value: float, step: int, wall: float) -> None:
        self.calls += 1
        raise ConnectionError("tracking server went away")

    def flush(self) -> None:
        raise ConnectionError("tracking server went away")

    def close(self) -> None:
        raise ConnectionError("tracking server went away")


def test_a_tracker_failing_while_running_is_said_once_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    broken = BrokenTracker()
    monkeypatch.setattr("zmqrl.metrics.open_tracker", lambda *args: broken)
    run_dir = tmp_path / "runs" / "cart"
    logger = run_logger(run_dir, "learner", config=tracked(run_dir, backends="[mlflow]"))
    with caplog.at_level(logging.WARNING, logger="zmqrl.metrics"):
        for step in range(3):
            logger.scalar("charts/eval_return", 1.0, step)
        logger.flush()
        logger.close()
    assert broken.calls == 3
    assert [r.getMessage() for r in caplog.records] == [
        "learner: cannot write mlflow metrics (tracking server went away); the run goes on"
    ]
    assert len(list(read_metrics(run_dir / METRICS_FILE))) == 3


def test_a_tracker_that_cannot_start_its_run_is_said_once_and_the_run_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    run_dir = tmp_path / "runs" / "cart"
    cfg = tracked(run_dir, backends="[mlflow]", mlflow_tracking_uri="http://127.0.0.1:9")  # discard port
    with caplog.at_level(logging.WARNING, logger="zmqrl.metrics"):
        logger = run_logger(run_dir, "learner", config=cfg)
        logger.scalar("charts/eval_return", 1.0, 1)
        logger.close()
    (warning,) = [r.getMessage() for r in caplog.records]
    assert warning.startswith("learner: cannot write mlflow metrics (") and warning.endswith(
        "the run goes on"
    )
    assert [r["value"] for r in read_metrics(run_dir / METRICS_FILE)] == [1.0]


def test_params_are_the_config_flattened_to_dotted_keys() -> None:
    assert flatten({"run": {"name": "cart", "seed": 3}, "env": {"kwargs": {}, "id": None}, "on": True}) == {
        "run.name": "cart",
        "run.seed": "3",
        "env.kwargs": "{}",
        "env.id": "null",
        "on": "true",
    }
