"""Weights & Biases as a sink of the run's logger (the ``wandb`` extra).

One W&B run per role process (see zmqrl.metrics.trackers for names and grouping). Scalars of one
step are sent as one history row. Tags have their own x-axes (env steps for some, updates for
others), so W&B's own row counter is not used as the x-axis: every row carries the zmqrl step under
``STEP_KEY`` and every tag is charted against it.

What wandb does on its own is kept out of the role: no login prompt (a role without an API key
goes on without W&B, said once), no console capture (the role's log stays the role's), no git or
code snapshot. wandb starts a helper process (wandb-core) even offline; the
last sink of a process to close tears it down (unless the caller has a W&B run of its own, in
zmqrl.api use), so nothing of W&B outlives the role; it also ends by itself when its parent dies.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from zmqrl.metrics.sinks import TrackerOptions, bounded, finite

# The key under which each row carries the step its tags were reported at.
STEP_KEY = "step"

# Seconds wandb.init may wait for the W&B server before the role goes on without it (its default,
# 90 s, is longer than a role's main loop may stall before it is judged hung).
INIT_SECONDS = 30.0

_lock = threading.Lock()
_open = 0  # W&B runs this process has open: the last to close tears wandb's helper process down


class WandbSink:
    name = "wandb"

    def __init__(
        self, run_dir: Path, source: str, run_name: str, options: TrackerOptions, config: dict[str, Any]
    ) -> None:
        global _open
        import wandb  # late: the extra is optional and its import is not free

        self._wandb = wandb
        settings = wandb.Settings(
            console="off",
            silent=True,
            disable_git=True,
            init_timeout=INIT_SECONDS,
            save_code=False,
            reinit="create_new",  # beside a W&B run of the caller (zmqrl.api in a notebook), not into it
        )
        with _lock:
            # wandb asks for a login on a terminal when it finds no API key: a role must never
            # wait on a prompt (it fails here instead, said once); process-wide in wandb, so set
            # before init.
            wandb.setup(settings=wandb.Settings(silent=True))
            try:
                self._run = wandb.init(
                    project=options.project,
                    entity=options.wandb_entity,
                    group=run_name,
                    job_type=source,
                    name=f"{run_name}-{source}",
                    dir=str(run_dir),
                    mode=options.wandb_mode,  # type: ignore[arg-type]  # checked: online | offline
                    config=config,
                    settings=settings,
                )
            except BaseException:  # wandb's own KeyboardInterrupt on an aborted prompt included
                if _open == 0 and wandb.run is None:
                    wandb.teardown()  # the helper process it may have started: nothing outlives it
                raise
            _open += 1
        self._run.define_metric(STEP_KEY)
        self._run.define_metric("*", step_metric=STEP_KEY)
        self._row: dict[str, float] = {}
        self._step: int | None = None

    @property
    def directory(self) -> Path:
        """The W&B run's own directory (``<run dir>/wandb/<offline-|>run-...``)."""
        return Path(self._run.dir).parent

    def scalar(self, tag: str, value: float, step: int, wall: float) -> None:
        if not finite(value):
            return
        if self._step is not None and step != self._step:
            self.flush()
        self._step = int(step)
        self._row[tag] = float(value)

    def flush(self) -> None:
        row, self._row = self._row, {}
        if row and self._step is not None:
            self._run.log({**row, STEP_KEY: self._step})

    def close(self) -> None:
        try:
            self.flush()
        finally:
            bounded(self._finish, f"W&B run {self._run.name}")

    def _finish(self) -> None:
        global _open
        try:
            self._run.finish()
        finally:
            with _lock:
                _open -= 1
                last = _open == 0
            if last and self._wandb.run is None:  # the caller's own W&B run (zmqrl.api) keeps it
                self._wandb.teardown()
