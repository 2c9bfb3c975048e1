"""Which control-plane authentication a process uses, decided from its config once at start-up.

A role (learner, actor, evaluator) signs its heartbeats and verifies the supervisor's messages
with its own role key when the run has a token (read from ``transport.control_keys_dir``, or
derived from the token it was given); with Curve keys, it must hold a key bound to its role, or it
refuses to start (the supervisor would drop every heartbeat it sent). A supervisor checks every
heartbeat: against the key its connection was made with (Curve keys), against the key of the role
that signed it (the token), or not at all, which only loopback or ``--insecure`` allows (the bind
rule of :mod:`zmqrl.transport.exposure`). ``zmqrl launch`` makes a fresh token and role keys for
every run; a supervisor that holds a token writes the role keys wherever ``control_keys_dir`` says.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from zmqrl.config import Config
from zmqrl.transport.control_auth import ControlAuth
from zmqrl.transport.control_keys import (
    CONTROL_TOKEN_ENV,
    KEY_ROLES,
    LAUNCH_KEYS_DIR,
    LAUNCH_TOKEN_FILE,
    KeySource,
    write_role_keys,
    write_token_file,
)
from zmqrl.transport.exposure import is_loopback
from zmqrl.transport.identity import role_key_name, speaking_problem
from zmqrl.transport.keys import Security, SecurityError

log = logging.getLogger("zmqrl.security")


def key_source(cfg: Config, role: str | None = None) -> KeySource:
    """What ``role`` (None: the supervisor) holds of the run's control secrets: its own role key
    under ``transport.control_keys_dir`` if set, else the token (``ZMQRL_CONTROL_TOKEN`` wins over
    ``transport.control_token_file``)."""
    t = cfg.transport
    path = Path(t.control_token_file).expanduser() if t.control_token_file else None
    keys_dir = Path(t.control_keys_dir).expanduser() if t.control_keys_dir else None
    return KeySource(os.environ.get(CONTROL_TOKEN_ENV), path, keys_dir, role)


def with_role_key(cfg: Config, role: str, role_id: int) -> Config:
    """``cfg`` with the client pair this role uses (``identity.role_key_name``): with keys and the
    default ``transport.key_name``, the pair named for the replica or role when the keys directory
    holds one. For the role commands, before anything opens a socket."""
    t = cfg.transport
    if not t.keys_dir:
        return cfg
    name = role_key_name(Path(t.keys_dir).expanduser(), t.key_name, role, role_id)
    return cfg if name == t.key_name else replace(cfg, transport=replace(t, key_name=name))


def role_control_auth(cfg: Config, security: Security | None, role: str, role_id: int) -> ControlAuth:
    """A role's heartbeat sender and control subscriber. With keys it needs no token: Curve binds
    its heartbeats to its key's role, and proves the supervisor by the server key. Raises
    SecurityError when its key may not speak as ``role-role_id``."""
    if security is not None and (problem := speaking_problem(security.client_name, role, role_id)):
        raise SecurityError(problem)
    return ControlAuth(key_source(cfg, role if role in KEY_ROLES else None))


def supervisor_control_auth(
    cfg: Config, security: Security | None, *, launching: bool
) -> tuple[ControlAuth, Config]:
    """The supervisor's heartbeat receiver and control publisher, and its config.

    ``launching`` (``zmqrl launch``): without a token of the user's, a fresh one is written to
    ``RUN_DIR/control.token`` (mode 0600) for every run; the role keys from the token go under
    ``RUN_DIR/control-keys/`` (or ``transport.control_keys_dir``), which the returned config (the one
    its children read) names instead of the token, so each child reads its own key, never the token,
    and nothing travels on a command line.
    ``zmqrl supervise`` writes ``transport.control_token_file`` when it does not exist yet, and the
    role keys under ``transport.control_keys_dir`` when set (compose roles wait for them on volumes
    of their own). Warns when nothing authenticates a control plane that is reachable from other
    machines (``--insecure`` without keys or token)."""
    keys = key_source(cfg)
    t = cfg.transport
    if keys.configured and keys.path is not None and not os.environ.get(CONTROL_TOKEN_ENV):
        write_token_file(keys.path)
    elif launching and not keys.configured:
        path = cfg.run_dir / LAUNCH_TOKEN_FILE
        write_token_file(path, replace=True)
        keys = KeySource(None, path)
    if launching and keys.configured:
        # The children read their own keys; the token stays the supervisor's (held in ``keys``).
        keys_dir = t.control_keys_dir or str(cfg.run_dir / LAUNCH_KEYS_DIR)
        t = replace(t, control_token_file=None, control_keys_dir=keys_dir)
        cfg = replace(cfg, transport=t)
    token = keys.token() if keys.configured else None
    if token is not None and t.control_keys_dir:
        write_role_keys(token, Path(t.control_keys_dir).expanduser())
    exposed = not (is_loopback(t.heartbeat) and is_loopback(t.control))
    if security is None and not keys.configured and exposed and t.insecure:
        log.warning(
            "heartbeats and control messages on %s / %s are not authenticated (--insecure, no keys, no "
            "control token): any peer that reaches them can end this run or fake a role. Set "
            "transport.control_token_file=FILE for the supervisor and every role (docs/deployment.md)",
            t.heartbeat,
            t.control,
        )
    return ControlAuth(keys, curve_identities=security is not None), cfg
