"""A role's two channels to the supervisor: heartbeats out, stop broadcasts in, from a thread of
its own.

Alive is not the same as making progress. The heartbeat thread beats every
``supervisor.heartbeat_interval`` whatever the main loop is doing (a long checkpoint, an
evaluation, torch still importing), so silence means the process is dead or stopped. Each beat
carries ``progress``: how many times the main loop called ``tick()``, and ``work``: how many of
those rounds did useful work (an update, env steps; not waiting for replay or for a full queue),
which is what the supervisor's restart policy calls a healthy run. A process whose beats go on but
whose progress does not is *hung* after its role's hung timeout (zmqrl/runtime/health.py):
in a process main the link's watchdog (zmqrl/runtime/watchdog.py) then ends the process with
exit 3, so any orchestrator replaces it. Process mains create the link first thing, before heavy
imports, and hand it to the role, so even start-up is covered. With ``supervisor.health_http`` set,
the link also serves each beat's verdict over HTTP (zmqrl/runtime/http_probe.py).

The sockets belong to the heartbeat thread alone (ZeroMQ sockets are not thread-safe); the main
thread only bumps counters and reads the stop flag.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path

import zmq

from zmqrl.config import Config
from zmqrl.runtime.guard import ThreadDied, start_guarded
from zmqrl.runtime.health import (
    PROGRESS_COUNTER,
    START_INFO_KEY,
    STOP_REASON_INFO_KEY,
    WORK_COUNTER,
    HealthRecord,
    health_clock,
    health_path,
    hung_timeout,
    startup_timeout,
    write_health,
)
from zmqrl.runtime.http_probe import INFO_KEY as HEALTH_HTTP_INFO_KEY
from zmqrl.runtime.http_probe import HealthServer, ProbeView
from zmqrl.runtime.supervisor_watch import REJOIN_GRACE_SECONDS, SupervisorWatch
from zmqrl.runtime.watchdog import Watchdog, end_hung_process
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.control import CONTROL_DROPS_COUNTER, ControlSubscriber, HeartbeatSender
from zmqrl.transport.control_trust import role_control_auth
from zmqrl.transport.keys import Security

# Set by a supervisor in its children's environment (`launch`), or by an orchestrator for roles
# that a watch-only `zmqrl supervise` tracks: they then watch the supervisor's heartbeat.
SUPERVISED_ENV = "ZMQRL_SUPERVISED"
# Set by `launch` to its own pid: a child whose parent is gone by the time it starts leaves at once.
PARENT_PID_ENV = "ZMQRL_PARENT_PID"
# What a learner that crashed announces on the weights channel before it exits.
LEARNER_FAILED = "learner failed"
# What a learner that reached its end announces: the only announcement a supervised role leaves on
# (a learner stopped or failed for any other reason is restarted, or the supervisor stops the run).
LEARNER_FINISHED = "learner finished"
# The supervisor's request to the learner (control.END_REQUEST_KEY) once every actor has reached
# actor.max_steps: no more data will come, so the run ends as finished.
END_ACTORS_DONE = "every actor done"
# Seconds between polls of the control socket; bounds how late a stop broadcast is noticed.
CONTROL_POLL_SECONDS = 0.1
# A heartbeat-thread round this late means the process itself was stopped or starved.
STALL_SECONDS = 1.0
# How long close() waits for the heartbeat thread to finish its current beat.
THREAD_JOIN_SECONDS = 2.0
_PR_SET_PDEATHSIG = 1

log = logging.getLogger("zmqrl.link")


def transport_security(cfg: Config) -> Security | None:
    """This process's Curve keys when the run uses them (``transport.keys_dir``), else None.

    The client pair is ``transport.key_name``, so hosts with their own named keys (``zmqrl keys DIR
    --client NAME``) can each be revoked alone.
    """
    if not cfg.transport.keys_dir:
        return None
    return Security.load(Path(cfg.transport.keys_dir), client=cfg.transport.key_name)


def socket_limits(cfg: Config) -> sockets.SocketLimits:
    t = cfg.transport
    return sockets.SocketLimits(
        samples_hwm=t.samples_hwm,
        max_message_bytes=t.max_message_mb * 2**20,
        linger_ms=t.linger_ms,
        samples_buffer_bytes=t.samples_buffer_kb * 1024,
    )


def die_with_parent() -> None:
    """Ask the kernel for SIGTERM when the process that started us dies (Linux), then check that it
    has not died already (the request only covers deaths from now on). Called by the child itself
    at start-up: setting it between fork and exec (``preexec_fn``) is unsafe in a parent that runs
    threads, as a supervisor with an authenticator thread does."""
    expected = os.environ.get(PARENT_PID_ENV)
    if sys.platform != "linux" or not expected:
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not glibc: rely on the control channel instead
        return
    if str(os.getppid()) != expected:
        log.error("the supervisor (pid %s) is already gone: exiting", expected)
        os.kill(os.getpid(), signal.SIGTERM)


class SupervisorLink:
    """Heartbeats (with counters and progress) and stop broadcasts, serviced by a thread.

    The main loop calls ``tick(counters)`` regularly: that is its progress (``useful=True`` when
    the round did useful work), and returns whether to stop. ``final()`` sends the last heartbeat
    with the final counters; ``close()`` ends it all. ``watchdog=True`` (process mains only) arms
    the watchdog. Tests drive it without the thread (``start=False``) by calling ``service()``.
    """

    def __init__(
        self,
        ctx: zmq.Context,
        cfg: Config,
        role: str,
        role_id: int,
        stop_event: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        watch_supervisor: bool | None = None,
        start: bool = True,
        health_file: Path | None = None,
        watchdog: bool = False,
        rejoin_grace: float | None = None,
    ) -> None:
        limits = socket_limits(cfg)
        security = transport_security(cfg)
        control_auth = role_control_auth(cfg, security, role, role_id)  # before any socket opens
        scfg = cfg.supervisor
        self._hb_sock = sockets.heartbeat_push(ctx, cfg.transport.heartbeat, limits, security=security)
        self._ctl_sock = sockets.control_sub(ctx, cfg.transport.control, limits, security=security)
        self.heartbeat = HeartbeatSender(
            self._hb_sock, role, role_id, scfg.heartbeat_interval, clock, auth=control_auth
        )
        self.control = ControlSubscriber(
            self._ctl_sock, BadMessages(f"{role}-{role_id} control", log), clock, auth=control_auth
        )
        self.role, self.role_id = role, role_id
        self.stop_event = stop_event or threading.Event()
        self.stop_reason = ""
        self._clock = clock
        self._next_control = 0.0
        # Under a supervisor: leave if it stays silent (it died, or hangs: how long is up to the
        # SupervisorWatch), so no process of a run outlives its supervisor for good. Until it is
        # first heard from, wait up to join_timeout (an orchestrator may start the supervisor after
        # the roles).
        if watch_supervisor is None:
            watch_supervisor = os.environ.get(SUPERVISED_ENV) == "1"
        self.supervised = bool(watch_supervisor)
        # Started by `launch`, the supervisor is known to be up (and the kernel tells us if it dies):
        # its first heartbeat is due within a start-up's time, not an orchestrator's; no grace.
        by_launch = bool(os.environ.get(PARENT_PID_ENV))
        self._join_timeout = scfg.startup_timeout if by_launch else scfg.join_timeout
        self._control_endpoint = cfg.transport.control
        self._created = self._last_service = clock()
        grace = (0.0 if by_launch else REJOIN_GRACE_SECONDS) if rejoin_grace is None else rejoin_grace
        self.watch = SupervisorWatch(
            self._control_endpoint,
            self._created,
            join_timeout=self._join_timeout,
            heartbeat_timeout=scfg.heartbeat_timeout,
            rejoin_grace=grace,
        )
        self._health = health_file if health_file is not None else health_path()
        self._health_limits = (scfg.heartbeat_timeout, hung_timeout(scfg, role))
        self._watchdog = (
            Watchdog(f"{role}-{role_id}", hung_timeout(scfg, role), startup_timeout(scfg), clock)
            if watchdog
            else None
        )
        # Shared with the main thread (plain attribute writes; the GIL makes each one atomic).
        self._counters: Callable[[], Mapping[str, float | int]] | None = None
        self._info: dict[str, str] = {}
        # Every beat says where it comes from, so `zmqrl status` can show pid@host for processes
        # that a watch-only supervisor did not start (another host, another container).
        self._host = socket.gethostname()[:64]
        # And which start of the process it is: in a container every role is pid 1 on the same
        # hostname, so only a per-start id tells a watch-only supervisor that a role restarted.
        self._start_id = uuid.uuid4().hex[:16]
        self._state = "starting"
        self._progress = 0
        self._work = 0
        self._progress_sent = -1
        self._progress_wall, self._progress_clock = time.time(), health_clock()
        self._closing = threading.Event()
        self._error: BaseException | None = None
        self._beat_lock = threading.Lock()  # final() must not interleave with a beat in flight
        # What the last beat said, for the HTTP probes (read on their threads, replaced whole).
        self._last_record: HealthRecord | None = None
        self._last_counters: Mapping[str, float | int] = {}
        self.http: HealthServer | None = None
        if scfg.health_http is not None:
            self.http = self._serve_health(scfg.health_http)
        if self.supervised and self._join_timeout > 0:
            log.info("watching the supervisor at %s", self._control_endpoint)
        self._thread = start_guarded(self._run, f"heartbeat-{role}", self._crashed) if start else None

    def _serve_health(self, address: str) -> HealthServer:
        """``/healthz`` and ``/readyz`` (zmqrl/runtime/http_probe.py). Asked for explicitly, so a
        port that cannot be bound ends the role (BindError naming the setting), sockets closed."""
        try:
            server = HealthServer(address, self.probe_view, f"health-http-{self.role}")
        except BaseException:
            self._ctl_sock.close(linger=0)
            self._hb_sock.close(linger=0)
            raise
        log.info("health probes on %s (/healthz, /readyz)", server.url)
        return server

    def probe_view(self) -> ProbeView:
        """The last beat's health record and counters: what the HTTP probes judge."""
        return ProbeView(self._last_record, self._last_counters)

    # ------------------------------------------------------------------ main-thread side
    def attach(self, stop_event: threading.Event) -> None:
        """Use the role's own stop event (a link made before the role exists has its own)."""
        if self.stop_event.is_set():
            stop_event.set()
        self.stop_event = stop_event

    def outlives(self, learner_stop_reason: str) -> bool:
        """Whether to stay up through the learner's announced end. Under a supervisor only a
        learner that finished ends the run: one that failed, or was stopped from outside (SIGTERM),
        is restarted and its actors (and evaluator) are needed again, and a stop the supervisor
        asked for reaches every role from the supervisor itself. Started by hand, a role leaves
        with its learner whatever the reason."""
        return self.supervised and learner_stop_reason != LEARNER_FINISHED

    def tick(
        self,
        counters: Callable[[], Mapping[str, float | int]],
        info: Mapping[str, str] | None = None,
        state: str = "running",
        useful: bool = False,
    ) -> bool:
        """Record progress (and what the next heartbeats report); ``useful``: this round did the
        role's work (not only waited). Returns whether to stop. Raises ``ThreadDied`` if the
        heartbeat thread died, so the role cannot go on unobserved."""
        if self._error is not None:
            raise ThreadDied(f"the heartbeat thread of {self.role}-{self.role_id} died") from self._error
        self._counters = counters
        if info is not None:
            self._info = dict(info)
        self._state = state
        self._progress += 1
        if useful:
            self._work += 1
        if self._thread is None:
            self.service()
        return self.stop_event.is_set()

    def progress(self) -> None:
        """Progress without a state change: for long work inside one step (an evaluation)."""
        self._progress += 1

    def final(
        self, state: str, counters: Mapping[str, float | int], info: Mapping[str, str] | None = None
    ) -> None:
        """Last heartbeat with the final counters (the supervisor's summary is built from it) and
        the stop reason, if one came."""
        self._stop_thread()
        self._state = state
        said = dict(info or self._info)
        if self.stop_reason:
            said[STOP_REASON_INFO_KEY] = self.stop_reason
        with self._beat_lock:
            self._last_counters = dict(counters)
            self.heartbeat.beat(state, {**counters, **self._liveness_counters()}, self._with_host(said))
            self._write_health()

    def close(self) -> None:
        self._stop_thread()
        if self.http is not None:
            self.http.close()
        self._ctl_sock.close(linger=0)
        self._hb_sock.close()  # default linger: lets the final heartbeat reach the supervisor

    # ------------------------------------------------------------------ heartbeat thread
    def service(self) -> None:
        """One round of the heartbeat thread: control poll, supervisor watch, beat if due."""
        now = self._clock()
        gap, self._last_service = now - self._last_service, now
        if gap > STALL_SECONDS and self.control.supervisor_seen is not None:
            # This process was stopped (SIGSTOP) or starved: the supervisor's heartbeats may still
            # sit in the kernel, so the silence is ours, not the supervisor's.
            self.control.supervisor_seen += gap
        if now >= self._next_control:
            self._next_control = now + CONTROL_POLL_SECONDS
            stop = self.control.poll_stop()
            if stop is not None and not self.stop_event.is_set():
                self.stop_reason = stop.reason or "stop broadcast"
                log.info("stop received from supervisor: %s", self.stop_reason)
                self.stop_event.set()
            if self.supervised:
                self._watch(now)
        if self.heartbeat.due():
            with self._beat_lock:
                if not self._closing.is_set():
                    self._beat()
        if self._watchdog is not None and not self._closing.is_set():
            reason = self._watchdog.check(self._progress)
            if reason is not None:
                self._state = "hung"
                self._write_health()
                end_hung_process(reason)

    def _watch(self, now: float) -> None:
        if self.stop_event.is_set():
            return
        reason = self.watch.judge(now, self.control.supervisor_seen)
        if reason is not None:
            self.stop_reason = reason
            self.stop_event.set()

    @property
    def lost_supervisor(self) -> bool:
        """It stopped because its supervisor stayed silent past the rejoin grace: the process exits
        EXIT_LOST_SUPERVISOR, so that its orchestrator restarts it."""
        return self.watch.lost

    def _beat(self) -> None:
        counters = dict(self._counters()) if self._counters is not None else {}
        progress = self._progress
        if progress != self._progress_sent:
            self._progress_sent = progress
            self._progress_wall, self._progress_clock = time.time(), health_clock()
        counters.update(self._liveness_counters())
        self._last_counters = counters
        self.heartbeat.beat(self._state, counters, self._with_host(None))
        self._write_health()

    def _liveness_counters(self) -> dict[str, int]:
        return {
            PROGRESS_COUNTER: self._progress,
            WORK_COUNTER: self._work,
            CONTROL_DROPS_COUNTER: self.control.bad.count,  # forged or malformed control messages
        }

    def _with_host(self, info: Mapping[str, str] | None) -> dict[str, str]:
        extra = {HEALTH_HTTP_INFO_KEY: self.http.address} if self.http is not None else {}
        return {**(info or self._info), "host": self._host, START_INFO_KEY: self._start_id, **extra}

    def _write_health(self) -> None:
        """The record of this beat: kept for the HTTP probes, and written to the health file."""
        self._last_record = record = HealthRecord(
            role=self.role,
            id=self.role_id,
            pid=os.getpid(),
            state=self._state,
            time=time.time(),
            progress=self._progress,
            progress_time=self._progress_wall,
            progress_clock=self._progress_clock,
            heartbeat_timeout=self._health_limits[0],
            progress_timeout=self._health_limits[1],
            info=self._with_host(None),
        )
        if self._health is not None:
            write_health(self._health, record)

    def _run(self) -> None:
        while not self._closing.wait(CONTROL_POLL_SECONDS):
            self.service()

    def _crashed(self, exc: BaseException) -> None:
        self._error = exc
        self.stop_event.set()

    def _stop_thread(self) -> None:
        self._closing.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=THREAD_JOIN_SECONDS)
