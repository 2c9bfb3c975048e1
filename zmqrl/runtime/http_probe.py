"""A role's health over HTTP: ``GET /healthz`` and ``GET /readyz`` from a small daemon-thread
server, for orchestrators that probe over the network (Kubernetes' ``httpGet``) rather than run a
command inside the container.

Opt-in: ``supervisor.health_http`` (``HOST:PORT``; port 0: any free one; None: off). The role's
supervisor link (zmqrl/runtime/link.py) starts the server with its heartbeat thread and stops it
on close, and puts the bound address in the heartbeat info (``health_http``) and the log.

- ``/healthz`` is the verdict of ``zmqrl health``, word for word: :func:`zmqrl.runtime.health.judge`
  over the record the role's last heartbeat wrote (alive *and* making progress). 200 or 503.
- ``/readyz`` says whether the role can do its job now: healthy, past start-up (its main loop
  ticked), and for the learner its sockets bound (it reports their endpoints), for an actor or
  the evaluator a weights version received from the learner. A learner still waiting for replay
  to fill counts as ready: it is doing its job (taking samples in), and a readiness that waited
  for updates would, with a Service that drops unready pods, keep the actors from ever filling it.

Bodies are one line of JSON with the reason. Any other path is 404, any other method 405; a
handler that raises answers 500 and is counted and logged, never taken further: the server must
not be what ends a role. Under ``zmqrl launch`` every role shares one host, so a fixed port would
collide: use port 0 there (each role's address is in its heartbeat info and its log); a container
or a pod has a network of its own and uses a fixed port.

The server is zmqrl/runtime/http_server.py's bounded one (a timeout per connection, a cap on
them, a bounded close), so idle clients can neither exhaust the role's descriptors nor keep the
kubelet's probe from an answer. A bind beyond loopback (a pod's 0.0.0.0) is one warning in the log.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from zmqrl.config import Config
from zmqrl.config_checks import health_http_problem, parse_http_address
from zmqrl.runtime.health import HealthRecord, judge
from zmqrl.runtime.http_server import BoundedServer, exposure_warning
from zmqrl.transport.sockets import BindError

HEALTHZ = "/healthz"
READYZ = "/readyz"
# The config key, named in every message about it.
SETTING = "supervisor.health_http"
# The heartbeat info key holding the address the server really bound (port 0 resolved).
INFO_KEY = "health_http"
# Counter a role's weights version is reported under (learner, actor, evaluator alike).
WEIGHTS_VERSION = "weights_version"
# The learner reports the endpoints it bound under these info keys once its sockets are up.
LEARNER_ENDPOINTS = ("samples", "weights")
# Roles that are ready only once they hold the learner's weights.
NEED_WEIGHTS = ("actor", "evaluator")

log = logging.getLogger("zmqrl.http_probe")


@dataclass
class ProbeView:
    """What the probes judge: the role's last health record (None before its first heartbeat) and
    the counters that beat carried."""

    record: HealthRecord | None
    counters: Mapping[str, float | int] = field(default_factory=dict)


def shared_host_problem(cfg: Config) -> str | None:
    """For ``zmqrl launch``, whose roles all run on one host: a fixed port would be bound by the
    first role and refused to every other (each then exits 1, in a restart loop). None when off or
    port 0."""
    value = cfg.supervisor.health_http
    if value is None or health_http_problem(cfg) is not None:  # off, or refused by the config check
        return None
    host, port = parse_http_address(value)
    if port == 0:
        return None
    return (
        f"{SETTING}: port {port} under `zmqrl launch`, where every role runs on this host and would "
        f"try to bind it: use port 0 ({host}:0), each role's address is then in its heartbeat info "
        f"and its log; fixed ports are for containers and pods, one role each"
    )


def healthz(view: ProbeView, now: float | None = None) -> tuple[bool, str]:
    """``/healthz``: the same verdict as ``zmqrl health`` on the same record."""
    if view.record is None:
        return False, "no heartbeat yet (the role is starting)"
    return judge(view.record, now)


def readyz(view: ProbeView, now: float | None = None) -> tuple[bool, str]:
    """``/readyz``: (ready, one-line reason); see the module's docstring for what ready means."""
    healthy, reason = healthz(view, now)
    record = view.record
    if not healthy or record is None:
        return False, reason
    who = f"{record.role}-{record.id}"
    if record.progress == 0:
        return False, f"{who} is starting: its main loop has not run yet"
    version = int(view.counters.get(WEIGHTS_VERSION, 0) or 0)
    if record.role == "learner":
        missing = [name for name in LEARNER_ENDPOINTS if name not in record.info]
        if missing:
            return False, f"{who} has not bound its {' and '.join(missing)} socket(s) yet"
        updates = int(view.counters.get("updates", 0) or 0)
        doing = f"{updates} updates" if updates else "waiting for replay to fill"
        return True, f"{who} ready: samples on {record.info['samples']}, {doing}, weights v{version}"
    if record.role in NEED_WEIGHTS:
        if version <= 0:
            return False, f"{who} holds no weights from the learner yet"
        return True, f"{who} ready: holding weights v{version}"
    return True, f"{who} ready: {record.state}"


CHECKS: dict[str, Callable[[ProbeView, float | None], tuple[bool, str]]] = {
    HEALTHZ: healthz,
    READYZ: readyz,
}


class _Server(BoundedServer):
    """The bounded server (see the module's docstring) answering with :class:`_Handler`."""

    def __init__(self, address: tuple[str, int], probe: HealthServer) -> None:
        self.probe = probe
        super().__init__(address, _Handler)

    def handle_failure(self, request: Any, client_address: Any) -> None:
        """An unexpected failure outside a handler's own ``try``: counted, logged. (A client gone,
        idle or pushed out is not a failure: BoundedServer drops it quietly.)"""
        self.probe.note_error(f"connection from {client_address[0]}", sys.exc_info()[1])


class _Handler(BaseHTTPRequestHandler):
    server: _Server  # HTTP/1.0: one answer a connection, so close() leaves no connection behind

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        check = CHECKS.get(path)
        if check is None:
            self._answer(
                404, {"ok": False, "reason": f"unknown path {path[:100]}; try {HEALTHZ} or {READYZ}"}
            )
            return
        try:
            ok, reason = check(self.server.probe.view(), None)
        except Exception as exc:  # a bug here must not end the role: answer, count, log
            self.server.probe.note_error(f"GET {path}", exc)
            self._answer(500, {"ok": False, "reason": f"internal error: {type(exc).__name__}"})
            return
        self._answer(200 if ok else 503, {"ok": ok, "reason": reason})

    def __getattr__(self, name: str) -> Callable[[], None]:
        """Every other method (``do_POST``, ``do_HEAD``, ...) answers 405."""
        if name.startswith("do_"):
            return self._not_allowed
        raise AttributeError(name)

    def _not_allowed(self) -> None:
        self._answer(405, {"ok": False, "reason": f"{self.command} not allowed: only GET"}, allow="GET")

    def _answer(self, status: int, body: dict[str, Any], allow: str | None = None) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if allow is not None:
            self.send_header("Allow", allow)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        """Silent: a probe every few seconds would fill the role's log."""


class HealthServer:
    """``/healthz`` and ``/readyz`` on ``address``, answered from ``view()`` (called on the server's
    threads: it must only read). Binds in the constructor (raises BindError naming the setting),
    serves from a daemon thread until ``close()``."""

    def __init__(self, address: str, view: Callable[[], ProbeView], name: str = "health-http") -> None:
        try:
            host, port = parse_http_address(address)
        except ValueError as exc:
            raise BindError(f"{SETTING}: {exc}") from None
        self.view = view
        self.errors = 0  # handler failures answered 500
        self._lock = threading.Lock()
        try:
            self._server = _Server((host, port), self)
        except OSError as exc:
            raise BindError(
                f"cannot serve {HEALTHZ} and {READYZ} on {address} ({SETTING}): {exc.strerror or exc}; "
                f"choose a free port, or port 0 for any free one (as under `zmqrl launch`, where every "
                f"role shares the host), or --set {SETTING}=null to turn it off"
            ) from None
        bound_host, bound_port = str(self._server.server_address[0]), self._server.server_address[1]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        self.address = f"{shown}:{bound_port}"  # port 0 resolved
        exposed = exposure_warning(SETTING, host, bound_port, f"{HEALTHZ} and {READYZ}")
        if exposed is not None:  # allowed (the kubelet probes the pod's address), never silently
            log.warning("%s", exposed)
        self._server.start(name)

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def note_error(self, what: str, exc: BaseException | None) -> None:
        with self._lock:
            self.errors += 1
            count = self.errors
        log.error("health http: %s failed (%d so far): %r", what, count, exc, exc_info=count == 1)

    def close(self) -> None:
        """Stop serving, release the port and drop every connection, within a bounded time
        (http_server.CLOSE_SECONDS) whatever the clients do; idempotent."""
        self._server.close()
