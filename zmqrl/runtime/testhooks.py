"""Faults that tests inject into real processes, named in one environment variable.

Liveness and recovery can only be tested end to end by making a real learner fail in the ways a
review found: a background thread that raises, a checkpoint that takes longer than the heartbeat
timeout, a main loop that deadlocks. ``ZMQRL_TEST_HOOKS`` holds ``name=value`` pairs separated
by commas; unset (always, outside tests) every hook is off and costs one dict lookup.

Hooks that fire once take a marker file as their value: the first process to find it absent
creates it and fires, so the supervisor's replacement runs normally.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

HOOKS_ENV = "ZMQRL_TEST_HOOKS"

# Names in use:
INGEST_FAULT_ONCE = "ingest_fault_once"  # the learner's ingest thread raises (marker file)
SLOW_CHECKPOINT = "slow_checkpoint"  # each learner checkpoint write first sleeps this many seconds
DEADLOCK_ONCE = "deadlock_once"  # the learner's main loop blocks forever after its first update
ACTOR_HANG_ONCE = "actor_hang_once"  # the first actor process to start hangs after ACTOR_HANG_STEPS
CRASH_AFTER_UPDATES = "crash_after_updates"  # every learner process raises after this many updates

# Env steps an actor takes (so it has done useful work) before ACTOR_HANG_ONCE hangs its main loop.
ACTOR_HANG_STEPS = 200
TORN_PAIR_ONCE = "torn_pair_once"  # the checkpoint writer stops between a snapshot and its ckpt (marker)


def hook(name: str) -> str | None:
    """The value of hook ``name``, or None when it is off."""
    spec = os.environ.get(HOOKS_ENV)
    if not spec:
        return None
    for item in spec.split(","):
        key, _, value = item.partition("=")
        if key.strip() == name:
            return value.strip()
    return None


def fire_once(name: str) -> bool:
    """Whether hook ``name`` fires in this process (its marker file did not exist; now it does)."""
    marker = hook(name)
    if not marker:
        return False
    try:
        fd = os.open(Path(marker), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def hang_after_steps(name: str) -> int | None:
    """The env steps after which this actor's main loop hangs, if hook ``name`` fires here."""
    return ACTOR_HANG_STEPS if fire_once(name) else None


def crash_after_updates() -> int | None:
    """The updates of its own after which this learner process raises, when the hook is on."""
    value = hook(CRASH_AFTER_UPDATES)
    return int(value) if value else None


def block_forever() -> None:
    """A deadlock, as far as the caller can tell."""
    threading.Event().wait()
