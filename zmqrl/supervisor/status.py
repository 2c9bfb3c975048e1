"""The supervisor's status channel: ``zmqrl status`` asks, the supervisor answers with a snapshot.

The supervisor (``launch`` and ``supervise``) binds a ROUTER socket on ``supervisor.status`` and
answers from its own loop (:meth:`StatusServer.serve`, non-blocking and bounded, like every other
drain there), so a status request costs the loop a snapshot at most twice a second and can
never block it. Where it listens is written to ``RUN_DIR/supervisor.json``
(:class:`StatusRecord`), which is how ``zmqrl status RUN_DIR`` finds a run.

The protocol, msgpack maps in one frame after an empty delimiter (a REQ or DEALER envelope)::

    request  {"want": "status", "id": N}
    reply    {"ok": true,  "id": N, "protocol": 1, "pid": PID, "snapshot": RunSnapshot.to_dict()}
    error    {"ok": false, "id": N or null, "protocol": 1, "error": "why"}

A malformed request is counted and logged (rate-limited, :class:`BadMessages`) and answered with
an error when it came with an envelope to answer to; it never reaches the snapshot or the loop.
Requests are read frame by frame within :data:`REQUEST_LIMIT`, so a peer cannot make the
supervisor copy more than a request's worth of one message.
Security is the heartbeat socket's: plaintext on loopback only unless ``--insecure``; with
``transport.keys_dir`` a CurveZMQ server that admits the run's authorized client keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import zmq

from zmqrl.supervisor.snapshot import RunSnapshot
from zmqrl.transport import sockets
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.keys import Security
from zmqrl.transport.receiving import FrameLimit, recv_bounded
from zmqrl.transport.wire import WireError

# Version of the request/reply maps above.
PROTOCOL = 1
# The file in the run directory that says where its supervisor answers.
STATUS_RECORD = "supervisor.json"
# Most requests one serve() answers; the rest wait for the next loop, so a flood cannot hold it.
SERVE_MAX_REQUESTS = 32
# The most one request may hold, read frame by frame (ZeroMQ's MAXMSGSIZE bounds each frame only):
# the peer's routing id (at most 255 bytes), the empty delimiter and the request map.
REQUEST_LIMIT = FrameLimit(max_frames=3, max_bytes=255 + sockets.MAX_REQUEST_BYTES)


class StatusError(RuntimeError):
    """The supervisor answered, but not with a snapshot (an error reply, or a reply that does not
    decode)."""


# --------------------------------------------------------------------------------------------
# The record in the run directory
# --------------------------------------------------------------------------------------------


@dataclass
class StatusRecord:
    """Where a run's supervisor answers, and whether it is still there (``RUN_DIR/supervisor.json``)."""

    endpoint: str  # the real endpoint bound (port 0 resolved)
    pid: int
    host: str
    command: str  # "launch" | "supervise"
    started: float  # Unix seconds
    state: str = "running"  # "running" | "finished" (the supervisor exited cleanly)
    ended: float | None = None  # Unix seconds, once finished
    keys_dir: str | None = None  # the run's CurveZMQ keys (a path on the supervisor's host), if any
    key_name: str = "client"  # the client key pair a local `zmqrl status` uses
    metrics_url: str | None = None  # the Prometheus /metrics URL served (port 0 resolved); None: off
    # Per slot ("actor-1"): {"restarts": N, "start": the start id of its process last heard}. What
    # a restarted `supervise` carries on from (zmqrl/supervisor/watch.py), so counts survive it.
    slots: dict[str, dict[str, Any]] = field(default_factory=dict)

    def write(self, run_dir: Path) -> Path:
        """Write atomically (a reader never sees half a record)."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / STATUS_RECORD
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(asdict(self), indent=2) + "\n")
        tmp.replace(path)
        return path

    @classmethod
    def read(cls, run_dir: Path) -> StatusRecord | None:
        """The record in ``run_dir``; None when there is none. Raises StatusError when it exists
        but cannot be read as one."""
        path = run_dir / STATUS_RECORD
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise StatusError(f"cannot read {path}: {exc}") from None
        try:
            return cls(
                endpoint=str(data["endpoint"]),
                pid=int(data["pid"]),
                host=str(data.get("host", "")),
                command=str(data.get("command", "launch")),
                started=float(data.get("started", 0.0)),
                state=str(data.get("state", "running")),
                ended=float(data["ended"]) if data.get("ended") is not None else None,
                keys_dir=str(data["keys_dir"]) if data.get("keys_dir") else None,
                key_name=str(data.get("key_name") or "client"),
                metrics_url=str(data["metrics_url"]) if data.get("metrics_url") else None,
                slots=_slot_marks(data.get("slots")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StatusError(f"{path} is not a supervisor record ({exc})") from None


def _slot_marks(raw: Any) -> dict[str, dict[str, Any]]:
    """The record's ``slots`` as written, each entry kept only when well formed (a record from
    before they were kept has none)."""
    if not isinstance(raw, dict):
        return {}
    marks: dict[str, dict[str, Any]] = {}
    for name, mark in raw.items():
        if not isinstance(name, str) or not isinstance(mark, dict):
            continue
        restarts, start = mark.get("restarts"), mark.get("start")
        if isinstance(restarts, int) and not isinstance(restarts, bool) and restarts >= 0:
            marks[name] = {"restarts": restarts, "start": start if isinstance(start, str) else None}
    return marks


# --------------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------------


class StatusServer:
    """Answers status requests with ``snapshot()`` from the supervisor's loop.

    ``snapshot`` returns the current snapshot, or None when the supervisor cannot make one (the
    request then gets an error reply saying so)."""

    def __init__(
        self, sock: zmq.Socket, snapshot: Callable[[], RunSnapshot | None], bad: BadMessages
    ) -> None:
        self._sock = sock
        self._snapshot = snapshot
        self.bad = bad
        self.answered = 0

    def serve(self, max_requests: int = SERVE_MAX_REQUESTS) -> int:
        """Answer the requests queued now (at most ``max_requests``); never blocks."""
        handled = 0
        for _ in range(max_requests):
            try:
                frames = recv_bounded(self._sock, REQUEST_LIMIT, copy=True)
            except zmq.Again:
                break
            except WireError as exc:  # more frames or bytes than a request has: dropped, no reply
                handled += 1
                self.bad.record(exc)
                continue
            handled += 1
            self._handle(frames)
        return handled

    def _handle(self, frames: list[Any]) -> None:
        identity, envelope = frames[0], frames[1:]
        if len(envelope) != 2 or envelope[0] != b"":
            self.bad.record(ValueError(f"status request of {len(envelope)} frame(s) without a delimiter"))
            return  # nothing to answer to: a reply without the delimiter would confuse a REQ peer
        request_id, problem = _parse_request(envelope[1])
        if problem:
            self.bad.record(ValueError(f"status request: {problem}"))
            self._reply(identity, {"ok": False, "id": request_id, "error": problem})
            return
        snap = self._snapshot()
        if snap is None:
            error = "the supervisor has no snapshot (see its log)"
            self._reply(identity, {"ok": False, "id": request_id, "error": error})
            return
        self._reply(identity, {"ok": True, "id": request_id, "pid": os.getpid(), "snapshot": snap.to_dict()})
        self.answered += 1

    def _reply(self, identity: bytes, body: dict[str, Any]) -> None:
        payload = msgpack.packb({**body, "protocol": PROTOCOL}, use_bin_type=True)
        # A peer gone (or too slow) loses its reply; the supervisor's loop goes on.
        with contextlib.suppress(zmq.Again, zmq.ZMQError):
            self._sock.send_multipart([identity, b"", payload], flags=zmq.NOBLOCK)


def _parse_request(payload: bytes) -> tuple[int | None, str]:
    """(the request's id, "" or why it is refused)."""
    try:
        request = msgpack.unpackb(payload, raw=False, strict_map_key=True, max_bin_len=0, max_ext_len=0)
    except Exception as exc:  # foreign bytes: any decoding error is the peer's, never ours
        return None, f"not msgpack ({type(exc).__name__})"
    if not isinstance(request, dict):
        return None, f"expected a map, got {type(request).__name__}"
    request_id = request.get("id")
    if request_id is not None and (type(request_id) is not int or not 0 <= request_id < 2**63):
        return None, "id must be a non-negative integer"
    if request.get("want") != "status":
        return request_id, f"unknown request {str(request.get('want'))[:40]!r} (expected want=status)"
    return request_id, ""


# --------------------------------------------------------------------------------------------
# Client
# --------------------------------------------------------------------------------------------


class StatusClient:
    """Asks one supervisor, as often as wanted (``zmqrl status --watch``)."""

    def __init__(
        self, endpoint: str, *, security: Security | None = None, ctx: zmq.Context | None = None
    ) -> None:
        self.endpoint = endpoint
        self._ctx = ctx or zmq.Context.instance()
        self._sock = sockets.status_dealer(self._ctx, endpoint, security=security)
        self._next_id = 1

    def fetch(self, timeout: float) -> RunSnapshot | None:
        """The supervisor's snapshot, or None when no answer came within ``timeout`` seconds.
        Raises StatusError for an error reply or one that does not decode."""
        request_id = self._next_id
        self._next_id += 1
        request = msgpack.packb({"want": "status", "id": request_id}, use_bin_type=True)
        try:
            self._sock.send_multipart([b"", request], flags=zmq.NOBLOCK)
        except zmq.Again:
            return None
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self._sock.poll(max(1, int(left * 1000)), zmq.POLLIN):
                return None
            reply = _decode_reply(self._sock.recv_multipart())
            if reply.get("id") != request_id:
                continue  # a late answer to an earlier request that timed out
            if not reply.get("ok"):
                raise StatusError(f"the supervisor refused the request: {reply.get('error')}")
            try:
                return RunSnapshot.from_dict(reply["snapshot"])
            except (KeyError, TypeError, ValueError) as exc:
                raise StatusError(f"the supervisor's snapshot does not decode: {exc}") from None
        return None

    def close(self) -> None:
        self._sock.close(linger=0)


def _decode_reply(frames: list[bytes]) -> dict[str, Any]:
    if len(frames) != 2 or frames[0] != b"":
        raise StatusError(f"reply of {len(frames)} frame(s) is not a status reply")
    try:
        reply = msgpack.unpackb(frames[1], raw=False, strict_map_key=True, max_ext_len=0)
    except Exception as exc:
        raise StatusError(f"reply is not msgpack ({type(exc).__name__})") from None
    if not isinstance(reply, dict):
        raise StatusError("reply is not a map")
    return reply


def fetch_status(
    endpoint: str,
    timeout: float,
    *,
    security: Security | None = None,
    ctx: zmq.Context | None = None,
) -> RunSnapshot | None:
    """One question to the supervisor at ``endpoint``: its snapshot, or None without an answer
    within ``timeout`` seconds (nothing listens there, or a Curve handshake was refused)."""
    client = StatusClient(endpoint, security=security, ctx=ctx)
    try:
        return client.fetch(timeout)
    finally:
        client.close()
