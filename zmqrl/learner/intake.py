"""The learner's handle on its intake process (zmqrl/learner/intake_process.py): starts it, hands it
the run's transport settings and the spec, takes its checked groups, keeps its newest report,
stops it.

The learner takes groups on its training thread, between updates and only as its replay ratio
admits them (zmqrl/learner/main.py): a copy into replay per group, with no second thread in the
process to contend with training for the interpreter lock. An intake that dies is the learner's
failure (:class:`IntakeDied`): the process exits non-zero and its supervisor restarts it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import zmq

from zmqrl.config import TransportConfig
from zmqrl.learner import intake_wire
from zmqrl.learner.ingest import Ingest
from zmqrl.replay.ratelimit import STAT_INSERT_BLOCKED, STAT_SAMPLE_BLOCKED
from zmqrl.spec import SampleSpec
from zmqrl.transport.channels import ZERO_COPY_MIN_OBS_BYTES
from zmqrl.transport.keys import SecurityError
from zmqrl.transport.messages import SampleGroup
from zmqrl.transport.sequence import EXTRA_TRACKED_IDS
from zmqrl.transport.sockets import BindError

log = logging.getLogger("zmqrl.learner")

# How long the intake may take to start and bind (a Python start and its imports, on a busy host).
START_SECONDS = 60.0
# How long a stopped intake may take to send its last report and leave before it is killed.
STOP_SECONDS = 5.0
# How long the learner waits to hand the intake an order (a credit, the spec) while it is not
# reading: past that, an intake that is still running is stuck, and a failure.
TELL_SECONDS = 30.0
# The module the intake runs as, and the command that runs it (its arguments follow).
INTAKE_MODULE = "zmqrl.learner.intake_process"
INTAKE_COMMAND = [sys.executable, "-m", INTAKE_MODULE]
# What the learner sends for each group it took: the intake may send one more.
CREDIT = intake_wire.dump({"credit": 1})
# Most groups taken into replay in one turn between two updates: a burst is spread over a few.
GROUPS_PER_TURN = 4
# While training, the least time between two turns when the intake merges: what arrives meanwhile
# goes into one group (each insert has a fixed cost whatever its rows), at a lag of a few milliseconds.
TAKE_EVERY_SECONDS = 0.005


class IntakeDied(RuntimeError):
    """The intake process ended while the learner still needed it."""


class IntakeBad:
    """The bad-message counts of both halves of ingest: what the intake dropped (its reports) and
    what the learner's own checks dropped (``own``: a weights version above the newest
    published). ``count`` is their sum, what the learner reports as ``bad_messages``."""

    def __init__(self, own: Any) -> None:
        self.own = own
        self.reported = 0
        self.reported_latest = ""  # why the intake dropped its newest

    @property
    def latest(self) -> str:
        """Why the newest drop (of the intake's, else the learner's own) was dropped; "" if none."""
        return self.reported_latest or str(self.own.latest)

    @property
    def count(self) -> int:
        return self.reported + int(self.own.count)

    def maybe_flush(self) -> bool:
        return bool(self.own.maybe_flush())

    def flush(self) -> bool:
        return bool(self.own.flush())


class ReportedSequences:
    """Each sender's sequence accounting as the intake last reported it (SequenceTracker's reads)."""

    def __init__(self, tracked_ids: int) -> None:
        self.tracked_ids = tracked_ids
        self._totals: dict[str, int] = {
            "lost_batches": 0,
            "reordered_batches": 0,
            "actor_restarts": 0,
            "tracked_actors": 0,
            "untracked_batches": 0,
            "untracked_samples": 0,
        }
        self._per_actor: dict[int, dict[str, int]] = {}

    def totals(self) -> dict[str, int]:
        return dict(self._totals)

    def per_actor(self) -> dict[int, dict[str, int]]:
        return {a: dict(s) for a, s in self._per_actor.items()}

    def take(self, report: dict[str, Any]) -> None:
        self._totals.update(report["seqs"])
        if "per_actor" in report:
            self._per_actor = {int(a): s for a, s in report["per_actor"]}


class IntakeProcess:
    """Start the intake (``start``), learn where it bound (``bound``), give it the spec
    (``begin``), take its groups (``take``), stop it (``close``). ``own_bad`` is the learner's
    tally of what its own checks drop, summed into ``bad``."""

    def __init__(self, ctx: zmq.Context, transport: TransportConfig, own_bad: Any) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="zmqrl-intake-"))  # mode 0700: this user's alone
        self.control = ctx.socket(zmq.PAIR)
        self.control.setsockopt(zmq.LINGER, 0)
        self.control.bind(f"ipc://{self._dir / 'control'}")
        self.groups = ctx.socket(zmq.PULL)
        self.groups.setsockopt(zmq.RCVHWM, intake_wire.GROUPS_HWM)
        self.groups.setsockopt(zmq.LINGER, 0)
        self.groups.bind(f"ipc://{self._dir / 'groups'}")
        self.bad = IntakeBad(own_bad)
        self.seqs = ReportedSequences(0)
        self.auth_denied = 0
        self.endpoint = ""
        self.merging = False  # whether the intake merges messages into groups (begin)
        self._copy = True  # receive groups as bytes (small rows) or zero-copy (begin)
        # The settings go in a file of the private directory, not down the control channel: a
        # pair socket's send blocks until its peer connects, and this one must not wait on the
        # intake's start (it binds while the learner imports torch) nor hang if it never comes.
        settings = self._dir / "transport"
        settings.write_bytes(intake_wire.dump({"transport": dataclasses.asdict(transport)}))
        cmd = [*INTAKE_COMMAND, f"ipc://{self._dir / 'control'}", f"ipc://{self._dir / 'groups'}",
               str(os.getpid()), str(settings)]  # fmt: skip
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)

    def bound(self, timeout: float = START_SECONDS) -> str:
        """The samples endpoint the intake bound; raises BindError / SecurityError as binding it
        here would have, IntakeDied if it ended first."""
        deadline = time.monotonic() + timeout
        while not self.control.poll(100):
            self._check_alive()
            if time.monotonic() > deadline:
                raise IntakeDied(f"the intake process did not bind transport.samples within {timeout:.0f} s")
        answer = intake_wire.load(self.control.recv())
        if "error" in answer:
            raise (SecurityError if answer.get("kind") == "security" else BindError)(answer["error"])
        self.endpoint = str(answer["bound"])
        return self.endpoint

    def begin(self, spec: SampleSpec, num_actors: int, group_messages: int) -> None:
        """Start checking and forwarding samples of ``spec``, up to ``group_messages`` per group.
        Merging (more than one) the intake may send one group ahead of what the learner took;
        else ``intake_wire.SINGLE_CREDITS`` (intake_wire: the credits), except for rollouts: an
        on-policy learner trains on every rollout in turn, so each one queued ahead of it is
        trained on one update later, by a policy further from the one that acted."""
        self.seqs.tracked_ids = num_actors + EXTRA_TRACKED_IDS
        self.merging = group_messages > 1
        self._copy = spec.obs_bytes < ZERO_COPY_MIN_OBS_BYTES  # small frames: bytes are cheaper
        order = {
            "spec": intake_wire.spec_to_dict(spec),
            "num_actors": num_actors,
            "group_messages": group_messages,
            "credits": 1 if self.merging or spec.rollout_length is not None else intake_wire.SINGLE_CREDITS,
        }
        self._tell(intake_wire.dump(order))

    def _tell(self, message: bytes, timeout: float | None = None) -> bool:
        """Send ``message`` to the intake without ever blocking for good: a pair socket's send
        waits while its peer is not connected, as when the intake has closed its end on the way
        out. Whether it went; False once the intake has ended (IntakeDied unless closing), or
        IntakeDied if it runs but takes nothing for ``timeout`` seconds."""
        timeout = TELL_SECONDS if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.control.send(message, flags=zmq.NOBLOCK)
                return True
            except zmq.Again:
                pass
            self._check_alive()
            if self.proc.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise IntakeDied(f"the learner's intake process took no order for {timeout:.0f} s")
            self.control.poll(50, zmq.POLLOUT)

    def ready(self, timeout_ms: int) -> bool:
        """Whether a group is ready within ``timeout_ms``; reads the reports that came meanwhile."""
        if self._closing:
            return False
        got = bool(self.groups.poll(timeout_ms))
        self.read_reports()
        return got

    def take(self) -> SampleGroup | None:
        """The next checked group, or None if none is queued (never waits)."""
        if self._closing or not int(self.groups.get(zmq.EVENTS)) & zmq.POLLIN:  # cheaper than a failed recv
            return None
        try:
            frames = self.groups.recv_multipart(flags=zmq.NOBLOCK, copy=self._copy)
        except zmq.Again:
            return None
        self._tell(CREDIT)  # room for the next one
        return intake_wire.load_group(frames if self._copy else [f.buffer for f in frames])

    def read_reports(self) -> None:
        """Take the intake's newest counts; raises IntakeDied if it has ended."""
        if self.control.closed:
            return
        while self.control.poll(0):
            message = intake_wire.load(self.control.recv())
            if "report" in message:
                report = message["report"]
                self.bad.reported = int(report["bad"])
                self.bad.reported_latest = str(report.get("bad_latest", ""))
                self.auth_denied = int(report["auth_denied"])
                self.seqs.take(report)
        self._check_alive()

    def _check_alive(self) -> None:
        code = self.proc.poll()
        if code is not None and not self._closing:
            raise IntakeDied(f"the learner's intake process ended (exit code {code}); see the log above")

    _closing = False

    def close(self) -> None:
        """Stop the intake (its last report is read), then close the channels; idempotent."""
        if not self._closing:
            self._closing = True
            if self.proc.poll() is None:
                stopping = time.monotonic()
                with contextlib.suppress(IntakeDied):  # not taking orders: it is killed below
                    self._tell(intake_wire.dump({"stop": "learner stopping"}), STOP_SECONDS)
                try:
                    self.proc.wait(max(0.0, STOP_SECONDS - (time.monotonic() - stopping)))
                except subprocess.TimeoutExpired:
                    log.warning("the intake process did not stop within %.0f s: killing it", STOP_SECONDS)
                    self.proc.kill()
                    self.proc.wait()
            self.read_reports()
            self.control.close()
            self.groups.close()
            shutil.rmtree(self._dir, ignore_errors=True)


class SampleFeed:
    """Moves the intake's checked groups into replay, on the training thread, between updates:
    ``take()`` admits each group once (the weights-version check) and inserts it when the replay
    ratio has room; a group it refuses is held for the next turn, and meanwhile nothing more is
    taken, so the intake stops reading and the actors feel backpressure. The time a group is held
    counts as the inserting side's wait, as it did when an ingest thread waited on the limiter."""

    def __init__(
        self, intake: IntakeProcess, ingest: Ingest, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.intake = intake
        self.ingest = ingest
        self.held: SampleGroup | None = None
        self._clock = clock
        self._held_mark = 0.0  # when the held group's wait was last counted
        self._due = 0.0  # take_if_due: when the next turn is

    def take_if_due(self) -> bool:
        """``take()`` at most every TAKE_EVERY_SECONDS where the intake merges (the training
        loop's call between updates); at every call where it does not (a replay ratio: one
        message a group)."""
        if self.intake.merging:
            now = self._clock()
            if now < self._due:
                return False
            self._due = now + TAKE_EVERY_SECONDS
        return self.take()

    def take(self, most: int = GROUPS_PER_TURN) -> bool:
        """Insert up to ``most`` groups as the replay ratio admits them; whether any went in."""
        took = False
        for _ in range(most):
            group = self.held
            while group is None and (taken := self.intake.take()) is not None:
                group = self.ingest.admit(taken, self.intake.bad.own)
            if group is None:
                break
            inserted = self.ingest.insert(group)
            if self.held is not None:  # it waited since the last turn
                now = self._clock()
                self.ingest.limiter.record_wait(STAT_INSERT_BLOCKED, now - self._held_mark)
                self._held_mark = now
            elif not inserted:
                self._held_mark = self._clock()
            if not inserted:
                self.held = group
                break
            self.held, took = None, True
        return took

    def wait(self, timeout_ms: int) -> None:
        """Wait up to ``timeout_ms`` for the intake's next group, counted as the training side's
        wait for data (the replay ratio, or a queue short of a batch, admitted no update)."""
        start = self._clock()
        self.intake.ready(timeout_ms)
        self.ingest.limiter.record_wait(STAT_SAMPLE_BLOCKED, self._clock() - start)
