"""What the operator sees of a run while its supervisor runs: the console view (a live dashboard on
a terminal, plain progress lines elsewhere), the status channel ``zmqrl status`` asks, the
supervisor's own scalars (``actor/...``, ``supervisor/...``) and the Prometheus ``/metrics``
endpoint (``supervisor.metrics_http``; zmqrl/supervisor/prometheus.py).

All three show one :class:`~zmqrl.supervisor.snapshot.RunSnapshot`, built from the supervisor's
slots at most every :data:`~zmqrl.supervisor.live.REFRESH_SECONDS` (a status request in between
gets the latest one) and freshly at each progress tick, so the supervisor's loop spends at most a
few milliseconds twice a second on them. The view and the status channel are for the operator:
if building a snapshot ever fails, that is logged once and they go without, while the supervisor
goes on looking after its children.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import zmq

from zmqrl.config import Config
from zmqrl.metrics import Logger, NullLogger, run_logger
from zmqrl.supervisor.live import REFRESH_SECONDS, ConsoleView
from zmqrl.supervisor.prometheus import URL_LINE, PrometheusExporter
from zmqrl.supervisor.render import plain_line, render_dashboard
from zmqrl.supervisor.snapshot import RunSnapshot, SnapshotBuilder
from zmqrl.supervisor.status import StatusRecord, StatusServer
from zmqrl.supervisor.summary import Slot
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.keys import Security

log = logging.getLogger("zmqrl.supervisor")


class RunMonitor:
    """The console view, the status server and record, and the scalars of one supervisor.

    ``slots`` is the supervisor's own (live) map; ``state`` says what the run is doing now
    ("starting", "running", "stopping"); ``command`` is "launch" or "supervise" (for the record).
    """

    def __init__(
        self,
        cfg: Config,
        view: ConsoleView,
        slots: Mapping[str, Slot],
        state: Callable[[], str],
        say: Callable[[str], None],
        *,
        command: str,
        clock: Callable[[], float] = time.monotonic,
        scalars: Logger | None = None,
    ) -> None:
        self.cfg = cfg
        self.view = view
        self._slots = slots
        self._state = state
        self._say = say
        self._command = command
        self._clock = clock
        self._builder: SnapshotBuilder | None = None
        self._latest: RunSnapshot | None = None
        self._latest_at = -math.inf
        self._broken = False  # building a snapshot failed once: the view and status go without
        self._sock: zmq.Socket | None = None
        self.status: StatusServer | None = None
        self.record: StatusRecord | None = None
        self._given_scalars = scalars  # tests pass a recorder; else the run's logger, from open()
        self.scalars: Logger = NullLogger()
        self.prometheus = PrometheusExporter(cfg, slots, command=command, clock=clock)
        self.metrics_url: str | None = None  # the /metrics URL served (port 0 resolved), if any
        self._pending: list[str] = []  # lines open() leaves for announce()
        # Slot marks (restarts, start id) a previous supervisor of the run recorded, for slots not
        # heard from yet: kept in the record until they are (zmqrl/supervisor/watch.py).
        self.carried: dict[str, dict[str, Any]] = {}

    # ------------------------------------------------------------------ lifetime
    def open(
        self,
        ctx: zmq.Context,
        launched: float,
        limits: sockets.SocketLimits,
        security: Security | None,
    ) -> str:
        """Serve /metrics (a line says where; an address that cannot be bound is a warning), bind
        the status socket, write the record, open the scalars (the caller starts the view, inside
        the ``try`` whose ``finally`` closes this); returns the status endpoint bound.
        Raises BindError / SecurityError as the other sockets do."""
        run_dir = self.cfg.run_dir
        # Said by announce(), once the supervisor's heartbeat runs: a console that blocks (a paused
        # terminal) must not hold up the opening of a run.
        self._pending = []
        self.metrics_url = self.prometheus.start(self._pending.append)
        if self.metrics_url is not None:
            self._pending.append(URL_LINE + self.metrics_url)
        self._builder = SnapshotBuilder(self.cfg, run_dir, launched)
        self._sock, endpoint = sockets.status_router(
            ctx, self.cfg.supervisor.status, limits, security=security, insecure=self.cfg.transport.insecure
        )
        self.status = StatusServer(self._sock, self._status_snapshot, BadMessages("supervisor status", log))
        t = self.cfg.transport
        self.record = StatusRecord(
            endpoint=endpoint,
            pid=os.getpid(),
            host=socket.gethostname(),
            command=self._command,
            started=launched,
            keys_dir=str(Path(t.keys_dir).resolve()) if t.keys_dir else None,
            key_name=t.key_name,
            metrics_url=self.metrics_url,
            slots=self._slot_marks(),
        )
        try:
            self.record.write(run_dir)
        except OSError as exc:  # the run goes on; only `zmqrl status RUN_DIR` cannot find it
            log.warning("cannot write in %s (%s): `zmqrl status --endpoint %s` works", run_dir, exc, endpoint)
        self.scalars = self._given_scalars or run_logger(
            run_dir, "supervisor", launched=launched, config=self.cfg
        )
        return endpoint

    def announce(self) -> None:
        """The lines ``open`` had to say (where /metrics is served, or why it is not)."""
        pending, self._pending = self._pending, []
        for line in pending:
            self._say(line)

    def close(self) -> None:
        """The view's last frame (state "finished") and the view taken down, then the socket and
        the scalars closed. Safe after a partial ``open`` and when called twice."""
        if self.view.live:
            snap = self.snapshot(fresh=True, state="finished")
            if snap is not None:
                self.view.show(render_dashboard(snap), self._clock())
        self.view.stop()
        self.prometheus.close()
        if self.status is not None:
            self.status.bad.flush()
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self.scalars.close()

    def finished(self) -> None:
        """Mark the record finished (the supervisor exited by itself, its summary written)."""
        if self.record is None:
            return
        self.record.state, self.record.ended = "finished", time.time()
        self.record.slots = self._slot_marks()
        try:
            self.record.write(self.cfg.run_dir)
        except OSError as exc:
            log.warning("cannot update %s: %s", self.cfg.run_dir, exc)

    def record_slots(self) -> None:
        """Keep every slot's restart count and start id in the run's record, so a supervisor
        restarted on the run carries them on (a slot joined, or restarted)."""
        if self.record is None:
            return
        self.record.slots = self._slot_marks()
        try:
            self.record.write(self.cfg.run_dir)
        except OSError as exc:
            log.warning("cannot update %s: %s", self.cfg.run_dir, exc)

    def _slot_marks(self) -> dict[str, dict[str, Any]]:
        marks = dict(self.carried)
        for name, slot in self._slots.items():
            marks[name] = {"restarts": slot.restarts, "start": slot.live.start}
        return marks

    # ------------------------------------------------------------------ from the loop
    def refresh(self) -> None:
        """From every turn of the supervisor's loop: answer status requests, redraw when due."""
        if self.status is not None:
            self.status.serve()
        self.prometheus.refresh()
        now = self._clock()
        self._watch_progress(now)
        if self.view.due(now):
            snap = self.snapshot()
            if snap is not None:
                self.view.show(render_dashboard(snap), now)

    def progress(self, actors_alive: int, bad_heartbeats: int) -> None:
        """At each progress tick: the plain line (off a terminal) and the supervisor's scalars."""
        self.prometheus.supervisor_counts(bad_heartbeats, self.bad_requests)
        snap = self.snapshot(fresh=True)
        if snap is None:
            return
        if not self.view.live:
            self._say(plain_line(snap))
        self._write_scalars(snap, actors_alive, bad_heartbeats)

    def _watch_progress(self, now: float) -> None:
        """The no-progress watch hears every turn's heartbeats (see SnapshotBuilder.watch_progress);
        like the snapshots, it must never end the run."""
        if self._builder is None or self._broken:
            return
        try:
            self._builder.watch_progress(self._slots, now)
        except Exception:
            self._broken = True
            log.exception("cannot watch the run's progress: the dashboard and `zmqrl status` stop here")

    def snapshot(self, *, fresh: bool = False, state: str | None = None) -> RunSnapshot | None:
        """The run now (or as of at most REFRESH_SECONDS ago, unless ``fresh``); None when no
        snapshot can be made (before ``open``, or after building one failed)."""
        now = self._clock()
        recent = now - self._latest_at < REFRESH_SECONDS
        if recent and not fresh and state is None and self._latest is not None:
            return self._latest
        if self._builder is None or self._broken:
            return None
        try:
            snap = self._builder.build(self._slots, now, state=state or self._state())
        except Exception:  # see the module docstring: the operator's view must not end the run
            self._broken = True
            log.exception("cannot build the run's snapshot: the dashboard and `zmqrl status` stop here")
            return None
        self._latest, self._latest_at = snap, now
        return snap

    @property
    def no_progress(self) -> str:
        """The no-progress warning as of the latest snapshot ("" when none, or no snapshot yet)."""
        return self._builder.no_progress.text if self._builder is not None else ""

    @property
    def bad_requests(self) -> int:
        """Malformed status requests dropped so far (for the summary's stats.json)."""
        return self.status.bad.count if self.status is not None else 0

    def _status_snapshot(self) -> RunSnapshot | None:
        return self.snapshot()

    # ------------------------------------------------------------------ scalars
    def _write_scalars(self, snap: RunSnapshot, actors_alive: int, bad_heartbeats: int) -> None:
        """The tags docs/metrics.md lists for the supervisor; step = the learner's updates, except
        ``actor/recent_return`` (env steps, as the learner's return curves)."""
        timeout, now = self.cfg.supervisor.heartbeat_timeout, self._clock()
        recent = [  # actors heard from lately: one that died contributes no rate
            s
            for s in self._slots.values()
            if s.role == "actor" and s.live.last_seen is not None and now - s.live.last_seen <= timeout
        ]
        builder = self._builder
        assert builder is not None, "snap was built by it"
        steps_per_s = sum(builder.recent_rate(a.name, "steps") for a in recent)
        samples_per_s = sum(builder.recent_rate(a.name, "samples") for a in recent)
        step, out = snap.updates, self.scalars
        out.scalar("actor/steps_per_s", steps_per_s, step)
        out.scalar("actor/samples_per_s", samples_per_s, step)
        out.scalar("actor/alive", float(actors_alive), step)
        if snap.train_return is not None:
            out.scalar("actor/recent_return", snap.train_return, snap.samples)
        restarts = snap.counters.get("restarts", sum(s.restarts for s in self._slots.values()))
        out.scalar("supervisor/restarts", float(restarts), step)
        out.scalar("supervisor/bad_heartbeats", float(bad_heartbeats), step)
        out.flush()
