"""Which control-plane authentication a process uses, decided from its config once at start-up.

A role (learner, actor, evaluator) signs its heartbeats and verifies the supervisor's messages
with the run's token when there is one; with keys, it must hold a key bound to its role, or it
refuses to start (the supervisor would drop every heartbeat it sent). A supervisor checks every
heartbeat: against the key its connection was made with (keys), against the token (no keys), or
not at all, which only loopback or ``--insecure`` allows (the bind rule of
:mod:`zmqrl.transport.exposure`). ``zmqrl launch`` makes a fresh token for every run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

from zmqrl.config import Config
from zmqrl.transport.control_auth import (
    CONTROL_TOKEN_ENV,
    LAUNCH_TOKEN_FILE,
    ControlAuth,
    TokenSource,
    write_token_file,
)
from zmqrl.transport.exposure import is_loopback
from zmqrl.transport.identity import role_key_name, speaking_problem
from zmqrl.transport.keys import Security, SecurityError

log = logging.getLogger("zmqrl.security")


def token_source(cfg: Config) -> TokenSource:
    """The run's token: ``ZMQRL_CONTROL_TOKEN`` wins over ``transport.control_token_file``."""
    path = cfg.transport.control_token_file
    return TokenSource(os.environ.get(CONTROL_TOKEN_ENV), Path(path).expanduser() if path else None)


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
    return ControlAuth(token_source(cfg))


def supervisor_control_auth(
    cfg: Config, security: Security | None, *, launching: bool
) -> tuple[ControlAuth, Config]:
    """The supervisor's heartbeat receiver and control publisher, and its config.

    ``launching`` (``zmqrl launch``): without a token of the user's, a fresh one is written to
    ``RUN_DIR/control.token`` (mode 0600) for every run and named in the returned config, which is
    the file the children read: it reaches them without a command line or an inherited variable.
    ``zmqrl supervise`` writes ``transport.control_token_file`` when it does not exist yet (compose
    roles wait for it on the shared volume). Warns when nothing authenticates a control plane that
    is reachable from other machines (``--insecure`` without keys or token)."""
    token = token_source(cfg)
    t = cfg.transport
    if token.configured and token.path is not None and not os.environ.get(CONTROL_TOKEN_ENV):
        write_token_file(token.path)
    elif launching and not token.configured:
        path = cfg.run_dir / LAUNCH_TOKEN_FILE
        write_token_file(path, replace=True)
        cfg = replace(cfg, transport=replace(t, control_token_file=str(path)))
        token = token_source(cfg)
    exposed = not (is_loopback(t.heartbeat) and is_loopback(t.control))
    if security is None and not token.configured and exposed and t.insecure:
        log.warning(
            "heartbeats and control messages on %s / %s are not authenticated (--insecure, no keys, no "
            "control token): any peer that reaches them can end this run or fake a role. Set "
            "transport.control_token_file=FILE for the supervisor and every role (docs/deployment.md)",
            t.heartbeat,
            t.control,
        )
    return ControlAuth(token, curve_identities=security is not None), cfg
