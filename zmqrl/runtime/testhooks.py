"""Faults that tests inject into real processes, named in one environment variable.

Liveness and recovery can only be tested end to end by making a real learner fail in the ways a
review found: a background thread that raises, a checkpoint that takes longer than the heartbeat
timeout, a main loop that deadlocks. ``ZMQRL_TEST_HOOKS`` holds ``name=value`` pairs separated
by commas. It is read once, at a role process's main (``Faults.from_env``), and the ``Faults``
built from it are handed to the role, which lets them wrap the parts they break as it builds them
(the actor's sampler, the learner's update and replay add, the checkpoint writer's steps): the
loops call those parts as always and hold no fault code, and a role given none (always, outside
tests, and whenever a role runs in a thread) wraps nothing.

Hooks that fire once take a marker file as their value: the first process to find it absent
creates it and fires, so the supervisor's replacement runs normally.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

HOOKS_ENV = "ZMQRL_TEST_HOOKS"

# Names in use:
INGEST_FAULT_ONCE = "ingest_fault_once"  # the learner's ingest thread raises (marker file)
SLOW_CHECKPOINT = "slow_checkpoint"  # each learner checkpoint write first sleeps this many seconds
DEADLOCK_ONCE = "deadlock_once"  # the learner's main loop blocks forever after its first update
ACTOR_HANG_ONCE = "actor_hang_once"  # the first actor process to start hangs after ACTOR_HANG_STEPS
CRASH_AFTER_UPDATES = "crash_after_updates"  # every learner process raises after this many updates
TORN_PAIR_ONCE = "torn_pair_once"  # the checkpoint writer stops between a snapshot and its ckpt (marker)

# Env steps an actor takes (so it has done useful work) before ACTOR_HANG_ONCE hangs its main loop.
ACTOR_HANG_STEPS = 200

# Each fault says so in the log of the role it happens in.
learner_log = logging.getLogger("zmqrl.learner")
actor_log = logging.getLogger("zmqrl.actor")


def parse(spec: str) -> dict[str, str]:
    """``name=value`` pairs separated by commas, as ``ZMQRL_TEST_HOOKS`` holds them."""
    hooks: dict[str, str] = {}
    for item in spec.split(","):
        key, _, value = item.partition("=")
        if key.strip():
            hooks.setdefault(key.strip(), value.strip())
    return hooks


def block_forever() -> None:
    """A deadlock, as far as the caller can tell."""
    threading.Event().wait()


class Collecting(Protocol):
    """What the actor's loop drives (``zmqrl.actor.sampler.Sampler`` and the rollout collector)."""

    @property
    def steps(self) -> int: ...

    def collect(self, budget: int) -> Any: ...


S = TypeVar("S", bound=Collecting)
F = TypeVar("F", bound=Callable[..., Any])


class Faults:
    """The faults one role process was asked to show, each at the point of its part that names it.

    Built at the process main (``from_env``) and injected into the role (``Learner``, ``Actor``),
    which passes it on to its trainer, ingest and checkpoints; every method is a no-op for a hook
    that is off.
    """

    def __init__(self, hooks: Mapping[str, str]) -> None:
        self.hooks = dict(hooks)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> Faults | None:
        """The faults ``ZMQRL_TEST_HOOKS`` asks for, or None when it is unset (outside tests)."""
        spec = environ.get(HOOKS_ENV)
        return cls(parse(spec)) if spec else None

    def value(self, name: str) -> str | None:
        """The value of hook ``name``, or None when it is off."""
        return self.hooks.get(name)

    def fire_once(self, name: str) -> bool:
        """Whether hook ``name`` fires in this process (its marker file did not exist; now it does)."""
        marker = self.value(name)
        if not marker:
            return False
        try:
            fd = os.open(Path(marker), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    # The actor's sampler.
    def sampler(self, sampler: S) -> S:
        """``sampler``, or, in the first actor process to start when ACTOR_HANG_ONCE is set, the
        same sampler whose ``collect`` hangs for good once it has taken ACTOR_HANG_STEPS env steps
        (the actor's main loop hangs there; its heartbeat thread goes on)."""
        if not self.fire_once(ACTOR_HANG_ONCE):
            return sampler
        collect = sampler.collect

        def hanging(budget: int) -> Any:
            if sampler.steps >= ACTOR_HANG_STEPS:
                actor_log.warning("test hook: the main loop hangs now")
                block_forever()
            return collect(budget)

        sampler.collect = hanging  # type: ignore[method-assign]
        return sampler

    # The learner's update.
    def update(self, update: F) -> F:
        """The agent's ``update``, or one that deadlocks after this process's first update
        (DEADLOCK_ONCE) or raises at its CRASH_AFTER_UPDATES-th (this process's own updates,
        whatever it resumed from)."""
        crash_after = self.value(CRASH_AFTER_UPDATES)
        if not crash_after and self.value(DEADLOCK_ONCE) is None:
            return update
        done = 0

        def faulty(*args: Any, **kwargs: Any) -> Any:
            nonlocal done
            result = update(*args, **kwargs)
            done += 1
            if done == 1 and self.fire_once(DEADLOCK_ONCE):
                learner_log.warning("test hook: the main loop deadlocks now")
                block_forever()
            if crash_after and done == int(crash_after):
                raise RuntimeError(f"test hook: the learner fails at update {done}")
            return result

        return faulty  # type: ignore[return-value]

    # The learner's replay add (ingest).
    def replay_add(self, add: F) -> F:
        """Replay's ``add``, or one that raises once, from this process's second add on
        (INGEST_FAULT_ONCE: in the first process to find its marker absent)."""
        if self.value(INGEST_FAULT_ONCE) is None:
            return add
        adds = 0

        def faulty(*args: Any, **kwargs: Any) -> Any:
            nonlocal adds
            adds += 1
            if adds > 1 and self.fire_once(INGEST_FAULT_ONCE):
                raise RuntimeError("test hook: replay add failed")
            return add(*args, **kwargs)

        return faulty  # type: ignore[return-value]

    # The learner's checkpoint writer.
    def slow_checkpoint(self) -> None:
        """Before each checkpoint write: sleep SLOW_CHECKPOINT seconds."""
        delay = self.value(SLOW_CHECKPOINT)
        if delay:
            learner_log.warning("test hook: checkpoint write sleeps %s s", delay)
            time.sleep(float(delay))

    def torn_pair(self, updates: int) -> None:
        """Between a replay snapshot and its checkpoint, from the second pair on: the writer stops
        there for good (TORN_PAIR_ONCE), the worst moment for a crash."""
        if self.fire_once(TORN_PAIR_ONCE):
            learner_log.warning("test hook: the checkpoint writer stops before ckpt at %d updates", updates)
            block_forever()
