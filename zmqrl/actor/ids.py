"""Which actor this process is: an id from ``--id``, from ``ZMQRL_ACTOR_ID``, or claimed automatically.

Why it matters: an actor's id picks its seed and its rung on the epsilon ladder, and the learner's
stats tell actors apart by it, so two actors sharing an id explore identically and are counted as
one. Scaled container replicas (``docker compose up --scale actor=8``) start with the same command
line and environment, and with host networking even the same hostname, so nothing they are given
can tell them apart. What they do share is the run directory (a named volume): ``auto`` takes the
lowest id whose lock file ``<run_dir>/actor-ids/<id>.lock`` no live process holds, with an
exclusive ``flock`` kept for the life of the process. The kernel drops the lock when the process
dies, however it dies, so a replaced replica gets its predecessor's id back at once, and there is
no stale state to clean up.

Precedence: an integer ``--id`` > ``ZMQRL_ACTOR_ID`` (an integer or ``auto``) > ``--id auto`` >
the default 0 (today's behaviour when nothing is given). Explicit ids take their lock too when it
is free, so automatic actors step around them; a clash is only warned about, never refused.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from zmqrl.errors import ConfigError

log = logging.getLogger("zmqrl.actor.ids")

# The environment variable that gives an actor its id (an integer, or "auto").
ACTOR_ID_ENV = "ZMQRL_ACTOR_ID"
# The value that asks for the lowest free id.
AUTO = "auto"
# Lock files live here, under the run directory.
LOCK_DIR = "actor-ids"
# Ids tried past actor.num_actors before giving up: more live actors than this is a runaway.
MAX_EXTRA_IDS = 1024
# Where an id came from (ActorIdClaim.source).
FROM_OPTION, FROM_ENV, FROM_AUTO, FROM_DEFAULT = "--id", ACTOR_ID_ENV, "auto", "default"


class ActorIdError(ConfigError):
    """An actor id that cannot be used (malformed, or no free id to claim); exit 2 at the CLI."""


@dataclass
class ActorIdClaim:
    """This process's actor id, and the lock that reserves it (held until ``release()`` or exit)."""

    actor_id: int
    source: str  # FROM_OPTION, FROM_ENV, FROM_AUTO or FROM_DEFAULT
    lock_path: Path | None = None  # the lock this process holds for the id, if any
    _fd: int | None = field(default=None, repr=False)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def describe(self) -> str:
        where = f", lock {self.lock_path}" if self.held else ""
        return f"actor id {self.actor_id} (from {self.source}{where})"

    def release(self) -> None:
        """Give the id back (closing the file drops the flock); safe to call more than once."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def parse_actor_id(text: str, what: str) -> int | str:
    """An id as given on the command line or in the environment: an int >= 0, or ``AUTO``."""
    value = text.strip()
    if value.lower() == AUTO:
        return AUTO
    try:
        number = int(value)
    except ValueError:
        number = -1
    if number < 0:
        raise ActorIdError(f"{what} must be an integer >= 0 or '{AUTO}', got {text!r}")
    return number


def resolve_actor_id(
    option: str | None, environ: Mapping[str, str], run_dir: Path, num_actors: int
) -> ActorIdClaim:
    """This actor's id: ``--id N`` > ``ZMQRL_ACTOR_ID`` > ``--id auto`` > 0 (see the module doc).

    Raises ActorIdError for a malformed value, or when no id can be claimed.
    """
    given = parse_actor_id(option, "--id") if option is not None else None
    if isinstance(given, int):
        return _explicit(given, FROM_OPTION, run_dir)
    env_text = environ.get(ACTOR_ID_ENV, "")
    from_env = parse_actor_id(env_text, ACTOR_ID_ENV) if env_text.strip() else None
    if isinstance(from_env, int):
        return _explicit(from_env, FROM_ENV, run_dir)
    if from_env == AUTO or given == AUTO:
        return claim_free_id(run_dir, num_actors)
    return ActorIdClaim(0, FROM_DEFAULT)


def claim_free_id(run_dir: Path, num_actors: int) -> ActorIdClaim:
    """Lock and return the lowest id no live process holds: first in [0, num_actors), then beyond."""
    lock_dir = _lock_dir(run_dir)
    for actor_id in range(max(num_actors, 0) + MAX_EXTRA_IDS):
        fd = _try_lock(lock_dir / f"{actor_id}.lock")
        if fd is None:
            continue
        if actor_id >= num_actors:
            log.warning(
                "ids 0..%d are all held by live actors (actor.num_actors is %d): this actor takes id "
                "%d, past the configured ladder of exploration rates (it explores between two of its rungs; "
                "set actor.num_actors to the number of actors to space the ladder for all of them)",
                num_actors - 1,
                num_actors,
                actor_id,
            )
        return ActorIdClaim(actor_id, FROM_AUTO, lock_dir / f"{actor_id}.lock", fd)
    raise ActorIdError(
        f"no free actor id in {lock_dir}: ids 0..{num_actors + MAX_EXTRA_IDS - 1} are all held by live "
        f"processes; give --id or {ACTOR_ID_ENV} explicitly"
    )


def _explicit(actor_id: int, source: str, run_dir: Path) -> ActorIdClaim:
    """An id that was given: take its lock if free (so `auto` steps around it), warn if not."""
    path = run_dir / LOCK_DIR / f"{actor_id}.lock"
    try:
        fd = _try_lock(_lock_dir(run_dir) / f"{actor_id}.lock")
    except ActorIdError as exc:  # e.g. a read-only run directory: the id stands, unreserved
        log.debug("not reserving %s: %s", path, exc)
        return ActorIdClaim(actor_id, source)
    if fd is None:
        log.warning(
            "actor id %d (from %s) is already held by another live process (see %s): two actors will "
            "share a seed and an exploration rate",
            actor_id,
            source,
            path,
        )
        return ActorIdClaim(actor_id, source)
    return ActorIdClaim(actor_id, source, path, fd)


def _lock_dir(run_dir: Path) -> Path:
    lock_dir = Path(run_dir) / LOCK_DIR
    try:
        lock_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ActorIdError(f"cannot create {lock_dir} to claim an actor id: {exc}") from None
    return lock_dir


def _try_lock(path: Path) -> int | None:
    """An open fd holding an exclusive flock on ``path``, or None when another process holds it.

    The fd is not inherited across exec (Python's default), and the lock lives as long as it is
    open. The file says who holds it, for an operator looking at the directory.
    """
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise ActorIdError(f"cannot open {path} to claim an actor id: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return None
        raise ActorIdError(
            f"cannot lock {path} ({exc}): this filesystem does not support flock; give --id or "
            f"{ACTOR_ID_ENV} explicitly"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode())
    return fd
