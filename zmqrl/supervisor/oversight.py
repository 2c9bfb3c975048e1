"""What every supervisor does, whether it started the processes (``launch``) or only watches them
(``supervise``): bind the heartbeat, control and status sockets, hear heartbeats into slots,
heartbeat on the control channel (from a thread of its own: ``supervisor/beacon.py``), handle
Ctrl-C / SIGTERM, show the run (a live dashboard on a terminal, progress lines elsewhere:
``supervisor/monitor.py``) and print the final summary.

The signal handlers only record the signal; the loop says what happened and acts (a handler
that printed deadlocked on the console's lock when the signal landed mid-redraw). A loop that
was blocked (a paused terminal, a full stdout pipe) did not hear the roles meanwhile: that time
is nobody's silence, and every slot's clocks move on by it before anyone is judged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any, TextIO

import zmq

from zmqrl.config import Config
from zmqrl.runtime.guard import ThreadDied
from zmqrl.runtime.health import HealthRecord, health_clock, health_path, write_health
from zmqrl.runtime.http_probe import HealthServer, ProbeView
from zmqrl.runtime.link import socket_limits, transport_security
from zmqrl.supervisor.beacon import ControlBeacon
from zmqrl.supervisor.live import ConsoleView
from zmqrl.supervisor.liveness import Liveness
from zmqrl.supervisor.monitor import RunMonitor
from zmqrl.supervisor.summary import Reporter, Slot
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.control import CONTROL_DROPS_COUNTER, ControlPublisher, HeartbeatReceiver
from zmqrl.transport.control_trust import supervisor_control_auth
from zmqrl.transport.security import start_authenticator
from zmqrl.transport.wire import HeartbeatMsg

# Seconds between repeated stop broadcasts while processes are still alive.
STOP_REPEAT_SECONDS = 0.5
# A gap this long between two turns of the loop means it was blocked (a paused terminal).
STALL_SECONDS = 1.0
# Exit codes of `zmqrl launch` and `zmqrl supervise` (docs/fault-tolerance.md "Exit codes"):
# finished; failed; a setting or state only the operator can fix; stopped on request.
EXIT_OK, EXIT_FAILED, EXIT_OPERATOR, EXIT_SIGINT, EXIT_SIGTERM = 0, 1, 2, 130, 143

log = logging.getLogger("zmqrl.supervisor")


class Oversight:
    """Sockets, slots and reporting shared by both supervisors; subclasses implement ``_run``.

    ``out`` is where the supervisor writes (stdout by default); ``dashboard`` None draws the live
    dashboard when ``out`` is a terminal, True / False force it (``--dashboard`` / ``--plain``).
    """

    command = "launch"  # how the status record names this supervisor
    # The exit code after a SIGTERM (the summary written first). launch: 143, as a process ended by
    # it; supervise overrides it with 0, since there SIGTERM is how its orchestrator asks it to stop.
    sigterm_exit = EXIT_SIGTERM

    def __init__(
        self,
        cfg: Config,
        *,
        out: TextIO | None = None,
        ctx: zmq.Context | None = None,
        clock: Callable[[], float] = time.monotonic,
        launched: float | None = None,
        dashboard: bool | None = None,
    ) -> None:
        self.cfg = cfg
        self._launched = launched  # when the command began (Unix s): "after launch" counts from it
        self.run_dir = cfg.run_dir
        # Every line the supervisor prints goes through the view (above the dashboard while it runs).
        self.view = ConsoleView(out or sys.stdout, dashboard=dashboard)
        self._out: TextIO = self.view  # type: ignore[assignment]
        self._ctx = ctx or zmq.Context.instance()
        self._clock = clock
        self.slots: dict[str, Slot] = {}
        # Written by the signal handler only (plain assignments: the handler sets flags, nothing
        # else); the loop reads them in _pump.
        self._signal: int | None = None  # the first stop signal
        self._signals = 0  # how many arrived: a second one kills every child at once
        self._signal_said = False
        self._second_signal_done = False
        self.shutdown_seconds = float("nan")
        self._last_pump: float | None = None  # clock() at the end of the last heartbeat drain
        self.summary: dict[str, Any] = {}
        self.failure: str | None = None  # why the run failed, in a few words, for the summary
        self._health = health_path()
        self._health_record: HealthRecord | None = None  # the latest beat's, for /healthz
        self._loops = 0  # turns of the loop: its progress (read by the beacon thread)
        # (loops, wall and health_clock() time they last changed), the beacon's own
        self._health_progress = (0, time.time(), health_clock())
        self.reporter = Reporter(cfg, self.run_dir, self._out, self._say)
        self.phase = "starting"  # "running" once the roles run; "stopping" from the shutdown on
        self.monitor = RunMonitor(
            cfg, self.view, self.slots, self._phase, self._say, command=self.command, clock=clock
        )

    @property
    def target_at_learner(self) -> dict[str, Any] | None:
        return self.reporter.target_at_learner

    # ------------------------------------------------------------------ entry point
    def run(self) -> int:
        self.launched = self._launched if self._launched is not None else time.time()
        self._t0 = self._clock()
        limits = socket_limits(self.cfg)
        security = transport_security(self.cfg)
        # How heartbeats are authenticated (keys bound to roles, or the run's token; launch makes
        # a fresh token per run, named in the config its children read).
        launching = self.command == "launch"
        control_auth, self.cfg = supervisor_control_auth(self.cfg, security, launching=launching)
        auth = start_authenticator(security, self._ctx) if security else None
        insecure = self.cfg.transport.insecure
        with contextlib.ExitStack() as opening:  # what is open so far is closed again if one fails
            if auth is not None:
                opening.callback(auth.stop)
            hb_sock, hb_ep = sockets.heartbeat_pull(
                self._ctx, self.cfg.transport.heartbeat, limits, security=security, insecure=insecure
            )
            opening.callback(hb_sock.close, linger=0)
            ctl_sock, ctl_ep = sockets.control_pub(
                self._ctx, self.cfg.transport.control, limits, security=security, insecure=insecure
            )
            opening.callback(ctl_sock.close, linger=0)
            # The heartbeat first, before anything slow (a W&B or MLflow run that takes up to ~36 s
            # to open against a tracker that does not answer, TensorBoard's writer): roles take a
            # silent supervisor for a dead one, and this may be a restarted supervisor they wait for.
            # From here on the control socket is the beacon thread's (stop and end go through it).
            self.control = ControlPublisher(ctl_sock, control_auth)
            interval = self.cfg.supervisor.heartbeat_interval
            self.beacon = ControlBeacon(self.control, interval, self._beat_health)
            opening.callback(self.beacon.close)  # before the socket closes
            opening.callback(self.monitor.close)  # also when open() fails halfway
            self.monitor.open(self._ctx, self.launched, limits, security)
            if self.cfg.supervisor.health_http is not None:  # the same probes as its roles
                probe = HealthServer(
                    self.cfg.supervisor.health_http, lambda: ProbeView(self._health_record), "health-http"
                )
                opening.callback(probe.close)
                log.info("health probes on %s (/healthz, /readyz)", probe.url)
            opened = opening.pop_all()
        self.heartbeats = HeartbeatReceiver(hb_sock, BadMessages("supervisor heartbeats", log), control_auth)
        self.cfg = replace(self.cfg, transport=replace(self.cfg.transport, heartbeat=hb_ep, control=ctl_ep))
        self.monitor.announce()  # console lines only now that a blocked console cannot stop the beat
        previous = self._install_signals()
        code = EXIT_FAILED
        try:
            self.view.start()
            code = self._run()
        finally:
            self.phase = "stopping"
            try:
                self._heed_signals()
                self._shutdown()
            finally:
                opened.close()  # the dashboard goes down first: the summary is printed below it
        if self._signal == signal.SIGINT:
            code = EXIT_SIGINT
        elif self._signal == signal.SIGTERM:
            code = self.sigterm_exit
        self._report(self._outcome(code))
        self.monitor.finished()
        for signum, handler in previous.items():  # a library caller gets its own handlers back
            signal.signal(signum, handler)
        return code

    def _outcome(self, code: int) -> str:
        """The run's end in the summary's words: finished, stopped on request, or failed."""
        if self._signal is not None:
            return f"stopped on request ({signal.Signals(self._signal).name}, exit code {code})"
        if code == EXIT_OK:
            return "finished"
        return f"failed (exit code {code})" + (f": {self.failure}" if self.failure else "")

    def _run(self) -> int:
        raise NotImplementedError

    def _own_counts(self) -> dict[str, int]:
        """What a subclass adds to the summary's ``supervisor`` figures."""
        return {}

    def _phase(self) -> str:
        return "stopping" if self._signal is not None else self.phase

    def _shutdown(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ heartbeats
    def _pump(self, timeout_ms: int) -> list[HeartbeatMsg]:
        """Act on signals, receive the roles' heartbeats; returns those received. (The control
        heartbeat is the beacon thread's.)"""
        self._heed_signals()
        if self.beacon.error is not None:
            raise ThreadDied("the supervisor's control heartbeat thread died") from self.beacon.error
        now = self._clock()
        if self._last_pump is not None and now - self._last_pump > STALL_SECONDS:
            for stalled in self.slots.values():
                stalled.live.unheard(now - self._last_pump)
        self._loops += 1
        beats = self.heartbeats.recv_all(timeout_ms)
        now = self._clock()
        for hb in beats:
            slot = self._slot_for(hb, now)
            if slot is None:
                continue  # a stranger, or a previous incarnation's last words
            slot.live.heard(hb, now)
            self.reporter.heard(self.slots, hb)
        self._last_pump = now  # before the view draws: a draw that blocks is a stall too
        self.monitor.refresh()
        return beats

    def _heed_signals(self) -> None:
        """Say which signal arrived (once), and kill every child at a second one."""
        if self._signal is not None and not self._signal_said:
            self._signal_said = True
            self._say(f"{signal.Signals(self._signal).name} received: {self._stopping_what()}")
        if self._signals > 1 and not self._second_signal_done:
            self._second_signal_done = True
            self._second_signal()

    def _progress(self, actors_alive: int) -> None:
        """A progress tick: the plain line off a terminal, and the supervisor's scalars."""
        self.monitor.progress(actors_alive, self.heartbeats.bad.count)

    def _slot_for(self, hb: HeartbeatMsg, now: float) -> Slot | None:
        raise NotImplementedError

    def _new_slot(self, role: str, index: int, now: float, pid: int | None = None) -> Slot:
        slot = Slot(role, index, Liveness(started=now, pid=pid, role=role))
        self.slots[slot.name] = slot
        return slot

    def _beat_health(self) -> None:
        """The supervisor's own health, from the beacon thread: its loop is its progress (a loop
        blocked on a paused terminal shows as hung in ``zmqrl health`` and ``/healthz``, while the
        run goes on). Kept for the HTTP probes, and written to the health file when there is one."""
        wall = time.time()
        loops = self._loops
        if loops != self._health_progress[0]:
            self._health_progress = (loops, wall, health_clock())
        self._health_record = HealthRecord(
            role="supervisor",
            id=0,
            pid=os.getpid(),
            state="running" if self._signal is None else "stopping",
            time=wall,
            progress=loops,
            progress_time=self._health_progress[1],
            progress_clock=self._health_progress[2],
            heartbeat_timeout=self.cfg.supervisor.heartbeat_timeout,
            progress_timeout=self.cfg.supervisor.progress_timeout,
        )
        if self._health is not None:
            write_health(self._health, self._health_record)

    # ------------------------------------------------------------------ signals
    def _install_signals(self) -> dict[int, Any]:
        """Ctrl-C and SIGTERM stop the run in order; returns the handlers they replaced."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum: int, _frame: Any) -> None:
            # Flags only: printing here deadlocks when the signal lands while the main thread
            # holds the console's lock (mid-redraw). _pump acts on them within a turn.
            if self._signal is None:
                self._signal = signum
            self._signals += 1

        previous: dict[int, Any] = {int(n): signal.getsignal(n) for n in (signal.SIGINT, signal.SIGTERM)}
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, handler)
        return previous

    def _stopping_what(self) -> str:
        return "stopping every process (press Ctrl-C again to kill them now)"

    def _second_signal(self) -> None:
        pass

    # ------------------------------------------------------------------ reporting
    def _say(self, text: str) -> None:
        elapsed = self._clock() - self._t0
        print(f"[{elapsed:7.1f}s] {text}", file=self._out, flush=True)

    def _report(self, outcome: str) -> None:
        bad = self.heartbeats.bad
        flush = getattr(bad, "flush", None)  # log what the rate limit held back
        if flush is not None:
            flush()
        extra = {
            "launched": self.launched,
            "wall_seconds": self._clock() - self._t0,
            "shutdown_seconds": self.shutdown_seconds,
            "bad_messages": bad.count,
            "supervisor": {
                "bad_heartbeats": bad.count,
                "unauthenticated_heartbeats": self.heartbeats.unauthenticated,  # in bad_heartbeats too
                "bad_status_requests": self.monitor.bad_requests,
                **self._own_counts(),
            },
            # Control messages each role dropped (forged or malformed), from its last heartbeat.
            "bad_control": {
                slot.name: int(slot.last.counters.get(CONTROL_DROPS_COUNTER, 0))
                for slot in self.slots.values()
                if slot.last is not None and slot.last.counters.get(CONTROL_DROPS_COUNTER)
            },
            "outcome": outcome,
            # The no-progress warning standing at the end (None: none): see progress_watch.py.
            "no_progress": self.monitor.no_progress or None,
        }
        self.summary = self.reporter.final(self.slots, extra)
