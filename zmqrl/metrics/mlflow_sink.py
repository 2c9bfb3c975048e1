"""MLflow as a sink of the run's logger (the ``mlflow`` extra).

One MLflow run per role process (see zmqrl.metrics.trackers for names and tags). The tracking URI
is ``logging.mlflow_tracking_uri``, else ``$MLFLOW_TRACKING_URI``, else ``file://<run dir>/mlruns``
(a file store needs no server; MLflow asks for an opt-in to use one, given here for file URIs).

A call to a tracking server can wait for minutes on retries, and the learner's loop must not: rows
are batched and sent by a thread of this sink. When its queue is full (a server that has stopped
answering), batches are dropped, said once. Closing waits a bounded time for what is queued, then
marks the MLflow run finished.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from zmqrl.metrics.sinks import TrackerOptions, bounded, finite

# MLflow's own limits on one log_batch call and on a param (mlflow.utils.validation).
METRICS_PER_BATCH = 1000
PARAMS_PER_BATCH = 100
PARAM_VALUE_CHARS = 6000
PARAM_KEY_CHARS = 250
# Rows are sent when this many are pending, or when the oldest has waited this long.
BATCH_ROWS = 500
BATCH_SECONDS = 5.0
# Batches waiting for the sender; beyond this they are dropped (the server is not keeping up).
QUEUE_BATCHES = 64
# MLflow's HTTP client retries a server that does not answer for minutes by default (7 retries,
# doubling waits, 120 s per request): a role starting against a server that is down would sit that
# long before going on without it, and a role's main loop stuck a minute is judged hung
# (supervisor.progress_timeout). These bound a first call to a dead server to about 36 s.
HTTP_DEFAULTS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}
# The tags every run of a zmqrl launch carries (search with tags."zmqrl.run" = '<name>').
RUN_TAG = "zmqrl.run"
SOURCE_TAG = "zmqrl.source"

log = logging.getLogger("zmqrl.metrics")


def tracking_uri(options: TrackerOptions, run_dir: Path) -> str:
    return (
        options.mlflow_tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or (run_dir / "mlruns").resolve().as_uri()
    )


class MlflowSink:
    name = "mlflow"

    def __init__(
        self, run_dir: Path, source: str, run_name: str, options: TrackerOptions, params: dict[str, str]
    ) -> None:
        uri = tracking_uri(options, run_dir)
        if uri.startswith("file:") or "://" not in uri:
            # MLflow 3 refuses its file store unless asked for; a file URI here is asking.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        else:  # a server: bounded waits unless the user chose theirs (see HTTP_DEFAULTS)
            for name, value in HTTP_DEFAULTS.items():
                os.environ.setdefault(name, value)
        from mlflow.entities import Metric, Param  # late: the extra is optional
        from mlflow.tracking import MlflowClient

        self._metric = Metric
        self._client = client = MlflowClient(tracking_uri=uri)
        experiment_id = _experiment_id(client, options.project)
        run = client.create_run(
            experiment_id, run_name=f"{run_name}-{source}", tags={RUN_TAG: run_name, SOURCE_TAG: source}
        )
        self.run_id: str = run.info.run_id
        self.uri = uri
        items = [
            Param(key[:PARAM_KEY_CHARS], value[:PARAM_VALUE_CHARS]) for key, value in sorted(params.items())
        ]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            client.log_batch(self.run_id, params=items[start : start + PARAMS_PER_BATCH])
        self._rows: list[Any] = []
        self._oldest = 0.0
        self._batches: queue.Queue[list[Any] | None] = queue.Queue(QUEUE_BATCHES)
        self._dropped = False
        self._failed = False
        self._sender = threading.Thread(target=self._send_all, name="mlflow sink", daemon=True)
        self._sender.start()

    def scalar(self, tag: str, value: float, step: int, wall: float) -> None:
        if not finite(value):
            return
        if not self._rows:
            self._oldest = time.monotonic()
        self._rows.append(self._metric(tag, float(value), int(wall * 1000), int(step)))
        if len(self._rows) >= BATCH_ROWS or time.monotonic() - self._oldest >= BATCH_SECONDS:
            self.flush()

    def flush(self) -> None:
        rows, self._rows = self._rows, []
        if not rows:
            return
        try:
            self._batches.put_nowait(rows)
        except queue.Full:
            if not self._dropped:
                self._dropped = True
                log.warning("MLflow at %s is not keeping up: metrics are dropped until it does", self.uri)

    def close(self) -> None:
        self.flush()
        bounded(self._finish, f"MLflow run {self.run_id}")

    def _finish(self) -> None:
        self._batches.put(None)
        self._sender.join()
        self._client.set_terminated(self.run_id, "FINISHED")

    def _send_all(self) -> None:
        """The sender thread: each batch in order until the end mark. It catches every error of
        the tracker (said once), so it never dies while the role runs."""
        while (rows := self._batches.get()) is not None:
            for start in range(0, len(rows), METRICS_PER_BATCH):
                try:
                    self._client.log_batch(self.run_id, metrics=rows[start : start + METRICS_PER_BATCH])
                except Exception as exc:  # the server's trouble, not the run's
                    if not self._failed:
                        self._failed = True
                        log.warning(
                            "cannot send metrics to MLflow at %s (%s); the run goes on", self.uri, exc
                        )


def _experiment_id(client: object, project: str) -> str:
    """The experiment ``project``, created if missing; several roles may create it at once."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    assert isinstance(client, MlflowClient)
    found = client.get_experiment_by_name(project)
    if found is not None:
        return str(found.experiment_id)
    try:
        return str(client.create_experiment(project))
    except MlflowException:  # another role created it first
        again = client.get_experiment_by_name(project)
        if again is None:
            raise
        return str(again.experiment_id)
