"""The control plane's token authentication without keys (issue 23 item 7): MAC, replay, token files.

Black-box against a real `zmqrl supervise`: tests/test_supervise.py. Curve keys bound to roles:
tests/test_security.py.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
import zmq

from tests.conftest import wait_until
from zmqrl.config import load_config
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.control import ControlPublisher, ControlSubscriber, HeartbeatReceiver, HeartbeatSender
from zmqrl.transport.control_auth import (
    CONTROL,
    CONTROL_TOKEN_ENV,
    ENVELOPE_BYTES,
    HEARTBEAT,
    ControlAuth,
    ReplayGuard,
    TokenError,
    TokenSource,
    Unauthenticated,
    new_token_text,
    seal,
    unseal,
)
from zmqrl.transport.control_trust import supervisor_control_auth
from zmqrl.transport.wire import HeartbeatMsg

LIMITS = sockets.SocketLimits(linger_ms=0)
KEY = b"k" * 32


def header(role: str = "learner", state: str = "finished") -> list[bytes]:
    return [bytes(f) for f in wire.dump(HeartbeatMsg(role, 0, 1, 0.0, state, {}, {}))]


def token(tmp_path: Path, name: str = "t") -> TokenSource:
    path = tmp_path / name
    path.write_text(new_token_text())
    path.chmod(0o600)
    return TokenSource(None, path)


def test_a_sealed_message_opens_once_and_never_again() -> None:
    guard = ReplayGuard()
    sealed = seal(KEY, header(), now=1000.0)
    assert len(sealed[0]) == ENVELOPE_BYTES
    assert unseal(KEY, sealed, now=1001.0, guard=guard) == header()
    with pytest.raises(Unauthenticated, match="replayed"):
        unseal(KEY, sealed, now=1002.0, guard=guard)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda f: [f[0], f[1].replace(b"finished", b"running!")],  # the header changed
        lambda f: [f[0][:-1] + bytes([f[0][-1] ^ 1]), f[1]],  # the MAC changed
        lambda f: [f[0][:10] + bytes([f[0][10] ^ 1]) + f[0][11:], f[1]],  # the time changed
        lambda f: [f[0], f[1], b"x"],  # a frame added
        lambda f: f[1:],  # no envelope: a plain, unauthenticated message
    ],
)
def test_a_changed_or_unsealed_message_is_refused(tamper: object) -> None:
    sealed = seal(KEY, header(), now=1000.0)
    with pytest.raises(Unauthenticated):
        unseal(KEY, tamper(sealed), now=1000.0, guard=ReplayGuard())  # type: ignore[operator]


def test_another_runs_key_and_a_stale_message_are_refused() -> None:
    with pytest.raises(Unauthenticated, match="bad MAC"):
        unseal(b"other" * 8, seal(KEY, header(), now=1000.0), now=1000.0, guard=ReplayGuard())
    with pytest.raises(Unauthenticated, match="off this host's clock"):
        unseal(KEY, seal(KEY, header(), now=1000.0), now=1000.0 + 61, guard=ReplayGuard())


def test_the_replay_guard_forgets_nonces_past_the_window_and_holds_at_most_its_capacity() -> None:
    guard = ReplayGuard(window=10.0, capacity=100)
    for i in range(1000):
        guard.admit(float(i) / 100, i.to_bytes(16, "little"), now=float(i) / 100)
    assert len(guard._seen) <= 100


def test_directions_have_keys_of_their_own(tmp_path: Path) -> None:
    """A heartbeat recorded off the wire cannot be played to the roles as a control message."""
    auth = ControlAuth(token(tmp_path))
    sealed = auth.seal(header("supervisor", "running"), HEARTBEAT)
    assert sealed is not None
    with pytest.raises(Unauthenticated, match="bad MAC"):
        auth.open(sealed, CONTROL, ReplayGuard())


def test_a_receiver_with_a_token_drops_every_unverified_message_and_counts_it(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    tokens = token(tmp_path)
    pull, endpoint = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    receiver = HeartbeatReceiver(pull, BadMessages("hb"), ControlAuth(tokens))
    push = sockets.heartbeat_push(ctx, endpoint, LIMITS)
    HeartbeatSender(push, "learner", 0, 1.0).beat("finished", {})  # no token: forged
    HeartbeatSender(push, "actor", 1, 1.0, auth=ControlAuth(token(tmp_path, "other"))).beat("running", {})
    HeartbeatSender(push, "actor", 2, 1.0, auth=ControlAuth(TokenSource(None, tokens.path))).beat(
        "running", {}
    )
    got: list[HeartbeatMsg] = []

    def all_heard() -> bool:
        got.extend(receiver.recv_all(50))
        return len(got) + receiver.bad.count >= 3

    wait_until(all_heard, 5, "three heartbeats")
    assert [(hb.role, hb.id) for hb in got] == [("actor", 2)]
    assert receiver.unauthenticated == 2
    push.close()
    pull.close()


def test_roles_hear_a_stop_only_from_the_holder_of_the_token(ctx: zmq.Context, tmp_path: Path) -> None:
    tokens = token(tmp_path)
    pub, endpoint = sockets.control_pub(ctx, "tcp://127.0.0.1:0", LIMITS)
    role = ControlSubscriber(
        sockets.control_sub(ctx, endpoint, LIMITS), BadMessages("ctl"), auth=ControlAuth(tokens)
    )
    forger = ControlPublisher(pub)  # no token
    supervisor = ControlPublisher(pub, ControlAuth(TokenSource(None, tokens.path)))
    deadline = time.monotonic() + 10
    while role.bad.count == 0:  # PUB drops until the subscription is through
        assert time.monotonic() < deadline
        forger.stop("forged")
        role._sock.poll(50)
        assert role.poll_stop() is None
    supervisor.stop("run finished")
    role._sock.poll(2000)
    stop = role.poll_stop()
    assert stop is not None and stop.reason == "run finished"
    pub.close()
    role._sock.close()


def test_a_role_whose_token_file_is_not_there_yet_sends_nothing_until_it_appears(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    path = tmp_path / "later"
    pull, endpoint = sockets.heartbeat_pull(ctx, "tcp://127.0.0.1:0", LIMITS)
    sender = HeartbeatSender(
        sockets.heartbeat_push(ctx, endpoint, LIMITS),
        "actor",
        0,
        0.0,
        auth=ControlAuth(TokenSource(None, path)),
    )
    sender.beat("running", {})
    assert sender.unsent == 1 and not pull.poll(200)
    path.write_text(new_token_text())
    receiver = HeartbeatReceiver(pull, BadMessages("hb"), ControlAuth(TokenSource(None, path)))
    sender.beat("running", {})
    assert [hb.id for hb in receiver.recv_all(5000)] == [0]


def test_a_token_that_is_no_token_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad"
    bad.write_text("not hex")
    with pytest.raises(TokenError, match="zmqrl keys --token FILE"):
        TokenSource(None, bad).key(HEARTBEAT)
    with pytest.raises(TokenError, match="fewer than 16"):
        TokenSource("abcd", None)


def test_launch_writes_a_fresh_private_token_per_run_and_names_it_in_the_childrens_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    cfg = load_config(None, [f"run.dir={tmp_path}", "run.name=r"])
    auth, launched = supervisor_control_auth(cfg, None, launching=True)
    path = Path(str(launched.transport.control_token_file))
    assert path == cfg.run_dir / "control.token" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.token is not None
    first = path.read_text()
    supervisor_control_auth(cfg, None, launching=True)
    assert path.read_text() != first, "every run gets a secret of its own"
    # `zmqrl supervise` (not launching) without a token configured authenticates nothing on loopback.
    plain, same = supervisor_control_auth(cfg, None, launching=False)
    assert not plain.enabled and same is cfg


def test_supervise_makes_the_configured_token_file_once_and_keeps_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    path = tmp_path / "shared" / "control.token"
    cfg = load_config(None, [f"transport.control_token_file={path}"])
    supervisor_control_auth(cfg, None, launching=False)
    made = path.read_text()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    supervisor_control_auth(cfg, None, launching=False)
    assert path.read_text() == made, "roles already hold it: it is never replaced"


def test_an_insecure_supervisor_beyond_loopback_without_keys_or_token_says_its_control_plane_is_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    exposed = [f"run.dir={tmp_path}", "transport.heartbeat=tcp://0.0.0.0:5557", "transport.insecure=true"]
    with caplog.at_level("WARNING", logger="zmqrl.security"):
        supervisor_control_auth(load_config(None, exposed), None, launching=False)
        supervisor_control_auth(
            load_config(None, [*exposed[:2], "transport.insecure=false"]), None, launching=False
        )
        token = tmp_path / "token"
        supervisor_control_auth(
            load_config(None, [*exposed, f"transport.control_token_file={token}"]), None, launching=False
        )
    warnings = [r.getMessage() for r in caplog.records if "not authenticated" in r.getMessage()]
    assert len(warnings) == 1 and "transport.control_token_file" in warnings[0]
