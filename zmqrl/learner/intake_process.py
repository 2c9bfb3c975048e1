"""The learner's intake process: all that samples from the network cost per message, off the
training process. It binds ``transport.samples``, receives, decodes and checks every message with
the one samples decoder (:mod:`zmqrl.transport.sample_channel`), keeps each sender's sequence
accounting, counts and logs what it drops, merges what is valid into groups and hands each group
to its learner (:mod:`zmqrl.learner.intake_wire`), which only copies it into replay.

Why a process: the learner used to receive on a thread of its own, sharing one interpreter lock
with training. Training gives the lock up at every torch call and then waits to get it back from a
thread that wants it, so a flood of samples cut the update rate sharply, and rationing that
thread's share capped what the learner could take whatever actors offered (docs/performance.md).
Here the per-message work runs beside training, not between its torch calls.

Started by :class:`zmqrl.learner.intake.IntakeProcess` as ``python -m zmqrl.learner.intake_process
CONTROL GROUPS PARENT_PID SETTINGS`` (SETTINGS: a file in the learner's private directory that
holds the transport settings). It dies with its learner (the kernel's parent-death signal, and a
check of the parent's pid), ends cleanly on ``stop``, and on anything unexpected prints its
traceback and exits 1, which its learner sees as a failure of its own.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import time
from dataclasses import replace
from typing import Any

import zmq

from zmqrl.config import Config, TransportConfig
from zmqrl.learner import intake_wire
from zmqrl.learner.intake_wire import REPORT_SECONDS
from zmqrl.runtime.link import socket_limits, transport_security
from zmqrl.transport import sockets
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.keys import SecurityError
from zmqrl.transport.messages import SampleGroup
from zmqrl.transport.sample_channel import SampleReceiver
from zmqrl.transport.security import start_authenticator
from zmqrl.transport.sequence import SequenceTracker

log = logging.getLogger("zmqrl.learner.intake")

# Seconds between the full per-sender tables in the reports (the totals go in every report).
PER_ACTOR_SECONDS = 1.0
# Most queued messages read and checked at once (their contents scanned together).
READ_MESSAGES = 32
# Exit codes, as the roles': a setting to fix (a port in use is the operator's too: exit 1 as the
# learner's own bind errors always were), a failure.
EXIT_OK, EXIT_FAILED = 0, 1
_PR_SET_PDEATHSIG = 1


class Intake:
    """One intake's sockets and loop (see the module docstring)."""

    def __init__(self, control_endpoint: str, groups_endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.control = self.ctx.socket(zmq.PAIR)
        self.control.setsockopt(zmq.LINGER, 1000)
        self.control.connect(control_endpoint)
        self.groups = self.ctx.socket(zmq.PUSH)
        self.groups.setsockopt(zmq.SNDHWM, intake_wire.GROUPS_HWM)
        self.groups.setsockopt(zmq.LINGER, 0)
        self.groups.connect(groups_endpoint)
        self.samples: zmq.Socket | None = None
        self.auth: Any = None
        self.receiver: SampleReceiver | None = None
        self._last_report = -float("inf")
        self._last_per_actor = -float("inf")
        self._reported: tuple[int, ...] = ()
        self._tracked = 0  # senders in the last per-sender table sent
        self._table: list[tuple[int, dict[str, int]]] = []  # the last per-sender table sent

    def bind(self, transport: dict[str, Any]) -> bool:
        """Bind the samples socket as the learner used to; tells the learner where, or why not."""
        cfg = replace(Config(), transport=TransportConfig(**transport))
        try:
            security = transport_security(cfg)
            self.auth = start_authenticator(security, self.ctx) if security is not None else None
            t = cfg.transport
            self.samples, endpoint = sockets.samples_pull(
                self.ctx, t.samples, socket_limits(cfg), security=security, insecure=t.insecure
            )
        except (sockets.BindError, SecurityError) as exc:
            kind = "security" if isinstance(exc, SecurityError) else "bind"
            self.control.send(intake_wire.dump({"error": str(exc), "kind": kind}))
            return False
        self.control.send(intake_wire.dump({"bound": endpoint}))
        return True

    def run(self, settings: dict[str, Any]) -> int:
        if not self.bind(settings["transport"]):
            return EXIT_OK  # the learner raises the error it was told
        order = intake_wire.load(self.control.recv())
        if "spec" not in order:
            return EXIT_OK  # stopped before it started
        assert self.samples is not None
        spec = intake_wire.spec_from_dict(order["spec"])
        seqs = SequenceTracker.for_run(int(order["num_actors"]))
        self.receiver = SampleReceiver(self.samples, spec, BadMessages("learner samples", log), seqs=seqs)
        self._forward(int(order["group_messages"]), int(order["credits"]))
        self._report(final=True)
        self.receiver.bad.flush()
        return EXIT_OK

    def _forward(self, group_messages: int, credits: int) -> None:
        """Receive, check and forward until the learner says stop, a group for each credit.

        Without a credit (the learner has not taken what was sent: it trains, or its replay
        ratio holds it back), what arrives meanwhile is read, checked and merged with what waits,
        up to ``group_messages`` messages: the busier the learner, the larger and fewer the groups
        it takes, each insert's fixed cost shared by more rows. Past that, nothing more is read
        (backpressure). With ``group_messages`` 1 (a replay ratio, or large rows) every message
        goes alone."""
        receiver = self.receiver
        assert receiver is not None and self.samples is not None
        poller = zmq.Poller()
        poller.register(self.control, zmq.POLLIN)
        waiting: list[SampleGroup] = []  # checked, not yet sent
        count = 0  # messages in them
        timeout_ms = int(REPORT_SECONDS * 1000)
        while True:
            room = group_messages - count
            poller.register(self.samples, zmq.POLLIN if room > 0 else 0)
            # A message the receiver holds back for the next group is ready although the socket
            # may be empty, as is a group for a credit: then only look, do not wait.
            ready = (room > 0 and receiver.holding) or (waiting and credits > 0)
            events = dict(poller.poll(0 if ready else timeout_ms))
            if self.control in events:
                order = intake_wire.load(self.control.recv())
                if "stop" in order:
                    return
                credits += int(order.get("credit", 0))
            if room > 0 and (self.samples in events or receiver.holding):
                group = receiver.recv_group(min(room, READ_MESSAGES))
                if group is not None:
                    waiting.append(group)
                    count += len(group.infos)
            if waiting and credits > 0:
                merged, rest = merge_ready(waiting)
                if self._send(intake_wire.dump_group(merged)):
                    waiting, credits = rest, credits - 1
                    count = sum(len(group.infos) for group in rest)
                else:  # its queue is full (the learner is away): merged, it waits for room
                    waiting = [merged, *rest]
            receiver.bad.maybe_flush()
            self._report()
            _exit_if_orphaned()

    def _send(self, frames: list[Any]) -> bool:
        try:
            self.groups.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return False
        return True

    def _report(self, final: bool = False) -> None:
        """The counts the learner reports, when they changed (at most every REPORT_SECONDS): the
        totals as they change, the per-sender table when a sender joined and otherwise at most
        every PER_ACTOR_SECONDS, when it changed."""
        now = time.monotonic()
        receiver = self.receiver
        if receiver is None or (not final and now - self._last_report < REPORT_SECONDS):
            return
        totals = receiver.seqs.totals()
        denied = int(getattr(self.auth, "denied", 0))
        key = (receiver.bad.count, denied, *totals.values())
        report: dict[str, Any] = {"bad": receiver.bad.count, "auth_denied": denied, "seqs": totals}
        report["bad_latest"] = receiver.bad.latest
        joined = totals["tracked_actors"] != self._tracked
        if final or joined or now - self._last_per_actor >= PER_ACTOR_SECONDS:
            table = list(receiver.seqs.per_actor().items())
            if final or table != self._table:
                report["per_actor"] = self._table = table
            self._last_per_actor, self._tracked = now, totals["tracked_actors"]
        if key == self._reported and "per_actor" not in report and not final:
            return
        self.control.send(intake_wire.dump({"report": report}))
        self._reported, self._last_report = key, now

    def close(self) -> None:
        for sock in (self.samples, self.groups, self.control):
            if sock is not None:
                sock.close()
        if self.auth is not None:
            self.auth.stop()
        self.ctx.term()


def merge(groups: list[SampleGroup]) -> SampleGroup:
    """Checked groups as one, their messages in the order received."""
    return SampleGroup.of([message for group in groups for message in group.messages])


def merge_ready(groups: list[SampleGroup]) -> tuple[SampleGroup, list[SampleGroup]]:
    """The first of ``groups`` merged with those after it that may share one replay add (all with
    priorities, or all without: the receiver cuts a group where that changes), and the rest, in
    the order received. Merging across such a cut raised in the intake and failed its learner
    whenever a prioritized run's peers mixed both while the learner was busy."""
    first = groups[0].priorities is None
    end = 1
    while end < len(groups) and (groups[end].priorities is None) == first:
        end += 1
    return (groups[0] if end == 1 else merge(groups[:end])), groups[end:]


def _die_with_parent(parent: int) -> None:
    """SIGTERM from the kernel when the learner dies (Linux), and a check that it has not already."""
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):  # not glibc: the loop's pid check stands in
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    _Parent.pid = parent
    _exit_if_orphaned()


class _Parent:
    pid = 0


def _exit_if_orphaned() -> None:
    if _Parent.pid and os.getppid() != _Parent.pid:
        log.error("the learner (pid %d) is gone: exiting", _Parent.pid)
        raise SystemExit(EXIT_FAILED)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    control, groups, parent, settings = args[0], args[1], int(args[2]), args[3]
    logging.basicConfig(
        stream=sys.stderr,
        level=os.environ.get("ZMQRL_INTAKE_LOG_LEVEL", "INFO"),
        format="%(asctime)s.%(msecs)03d %(levelname)s learner-0 intake %(name)s: %(message)s",
        datefmt="%Y-%m-%d %H:%M:%S",
    )
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(EXIT_FAILED))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the learner's to handle; it says stop
    _die_with_parent(parent)
    intake = Intake(control, groups)
    try:
        with open(settings, "rb") as f:
            return intake.run(intake_wire.load(f.read()))
    finally:
        intake.close()


if __name__ == "__main__":
    raise SystemExit(main())
