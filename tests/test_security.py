"""CurveZMQ security: key files, the bind rule, and live sockets that admit only listed clients."""

from __future__ import annotations

import dataclasses
import logging
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
import zmq.auth

from tests.conftest import wait_until
from zmqrl.config import ConfigError, load_config
from zmqrl.runtime.link import transport_security
from zmqrl.transport import sockets, wire
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.keys import Security, SecurityError, create_keys
from zmqrl.transport.security import (
    AuthenticatorHandle,
    _Denials,
    authenticator_running,
    check_bind_allowed,
    is_loopback,
    start_authenticator,
)
from zmqrl.types import TransitionBatch

LIMITS = sockets.SocketLimits(samples_hwm=4, linger_ms=0)
ANY_PORT = "tcp://127.0.0.1:0"
# How long a refused peer that has a message queued is given to (wrongly) get it through, after
# the expected messages arrived. Refusal is confirmed directly where possible (the authenticator's
# warning or count), so this window only has to catch a leak: no positive signal can rule one out,
# as messages on different connections are not ordered. Correct code passes whatever its length.
QUIET_S = 1.0
# Upper bound for anything that should happen promptly; tests finish long before it on success.
DEADLINE_S = 5.0


# --------------------------------------------------------------------------------------------
# Fixtures and helpers
# --------------------------------------------------------------------------------------------


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    keys_dir = tmp_path / "keys"
    create_keys(keys_dir)
    return keys_dir


@pytest.fixture
def security(keys: Path) -> Security:
    return Security.load(keys)


@pytest.fixture
def auth(ctx: zmq.Context, security: Security) -> Iterator[AuthenticatorHandle]:
    handle = start_authenticator(security, ctx)
    yield handle
    handle.stop()


def outsider(security: Security) -> Security:
    """Same server key, but a client pair that was never authorized."""
    public, secret = zmq.curve_keypair()
    return dataclasses.replace(security, server_secret=None, client_public=public, client_secret=secret)


def samples_frames(tag: int) -> list[bytes | memoryview]:
    """A small valid samples message whose ``seq`` identifies who sent it."""
    n = 2
    batch = TransitionBatch(
        obs=np.zeros((n, 4), np.float32),
        action=np.zeros(n, np.int64),
        reward=np.full(n, float(tag), np.float32),
        next_obs=np.zeros((n, 4), np.float32),
        discount=np.full(n, 0.99, np.float32),
    )
    return wire.dump(wire.SamplesMsg(actor_id=tag, seq=tag, weights_version=0, batch=batch, episodes=[]))


def send_within(sock: zmq.Socket, frames: list[bytes | memoryview], timeout: float = DEADLINE_S) -> bool:
    """Send without blocking forever (a PUSH with IMMEDIATE waits for a finished handshake)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            sock.send_multipart(frames, flags=zmq.NOBLOCK)
            return True
        except zmq.Again:
            time.sleep(0.01)
    return False


def receive_for(sock: zmq.Socket, seconds: float) -> list[list[bytes]]:
    """Every message ``sock`` receives within ``seconds``."""
    got = []
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        if sock.poll(int(left * 1000) + 1):
            got.append(sock.recv_multipart())
    return got


def receive_expected(sock: zmq.Socket, count: int, quiet: float = QUIET_S) -> list[list[bytes]]:
    """The first ``count`` messages to arrive (failing after DEADLINE_S: they are waited for, not
    hoped for within a window), then whatever else arrives within ``quiet`` seconds (a leak)."""
    got: list[list[bytes]] = []
    end = time.monotonic() + DEADLINE_S
    while len(got) < count:
        left = end - time.monotonic()
        assert left > 0 and sock.poll(int(left * 1000) + 1), f"{len(got)} of {count} messages arrived"
        got.append(sock.recv_multipart())
    return got + receive_for(sock, quiet)


def wait_for_refusal(caplog: pytest.LogCaptureFixture, key: bytes) -> None:
    """Block until the authenticator reports refusing ``key``: proof the attempt reached it."""
    end = time.monotonic() + DEADLINE_S
    while time.monotonic() < end:
        if any(key.decode() in r.getMessage() for r in caplog.records if r.name.startswith("zmqrl")):
            return
        time.sleep(0.01)
    raise AssertionError(f"the authenticator never refused {key!r}")


def actor_ids(messages: list[list[bytes]]) -> list[int]:
    decoded = [wire.load(m) for m in messages]
    assert all(isinstance(m, wire.SamplesMsg) for m in decoded)
    return [m.actor_id for m in decoded if isinstance(m, wire.SamplesMsg)]


# --------------------------------------------------------------------------------------------
# Key files
# --------------------------------------------------------------------------------------------


def test_create_keys_writes_the_documented_layout_with_private_secrets(tmp_path: Path) -> None:
    keys_dir = tmp_path / "k"
    written = create_keys(keys_dir)
    # The server pair, the tools' `client` pair and one pair per role, each authorized.
    expected = {"server.key", "server.key_secret"} | {
        path
        for name in ("client", "learner", "actor", "evaluator")
        for path in (f"{name}.key", f"{name}.key_secret", f"authorized/{name}.key")
    }
    assert {str(p.relative_to(keys_dir)) for p in written} == expected
    for path in written:
        mode = stat.S_IMODE(path.stat().st_mode)
        if path.name.endswith(".key_secret"):
            assert mode == 0o600, path
        else:
            assert mode == 0o644, path
    assert stat.S_IMODE(keys_dir.stat().st_mode) == 0o700
    # pyzmq reads them, the pairs belong together, and only secret files hold secrets.
    public, secret = zmq.auth.load_certificate(keys_dir / "client.key_secret")
    assert secret is not None and zmq.curve_public(secret) == public
    assert zmq.auth.load_certificate(keys_dir / "authorized/client.key") == (public, None)
    assert zmq.auth.load_certificate(keys_dir / "server.key")[1] is None


def test_create_keys_refuses_to_overwrite_the_server_key(keys: Path) -> None:
    before = (keys / "server.key_secret").read_bytes()
    with pytest.raises(FileExistsError, match=r"server key .*refusing to overwrite"):
        create_keys(keys)
    assert (keys / "server.key_secret").read_bytes() == before


def test_create_keys_adds_and_authorizes_a_new_client_in_an_existing_dir(keys: Path) -> None:
    server_before = (keys / "server.key_secret").read_bytes()
    written = create_keys(keys, ["actor-host-7"])
    assert {p.name for p in written} == {"actor-host-7.key", "actor-host-7.key_secret"}
    assert (keys / "server.key_secret").read_bytes() == server_before
    added = Security.load(keys, client="actor-host-7")
    assert zmq.auth.load_certificate(keys / "authorized/actor-host-7.key")[0] == added.client_public
    with pytest.raises(FileExistsError, match="actor-host-7"):
        create_keys(keys, ["actor-host-7"])


@pytest.mark.parametrize("name", ["../evil", "a/b", ".hidden", "server", "authorized", ""])
def test_create_keys_rejects_client_names_that_are_not_plain_file_names(tmp_path: Path, name: str) -> None:
    with pytest.raises(SecurityError, match="bad client name"):
        create_keys(tmp_path / "k", [name])
    assert not (tmp_path / "k").exists()


def test_load_reads_server_and_client_keys(keys: Path) -> None:
    sec = Security.load(keys)
    assert sec.can_serve and sec.server_secret is not None
    assert zmq.curve_public(sec.server_secret) == sec.server_public
    assert zmq.curve_public(sec.client_secret) == sec.client_public
    assert sec.authorized_dir == keys / "authorized"


def test_load_on_an_actor_host_without_the_server_secret_can_connect_but_not_serve(keys: Path) -> None:
    (keys / "server.key_secret").unlink()
    sec = Security.load(keys)
    assert sec.server_secret is None and not sec.can_serve


def test_load_of_a_missing_dir_says_to_run_zmqrl_keys(tmp_path: Path) -> None:
    with pytest.raises(SecurityError, match=r"does not exist.*`zmqrl keys"):
        Security.load(tmp_path / "nowhere")


@pytest.mark.parametrize("missing", ["server.key", "client.key_secret"])
def test_load_of_a_missing_file_names_it_and_zmqrl_keys(keys: Path, missing: str) -> None:
    (keys / missing).unlink()
    with pytest.raises(SecurityError, match=rf"{missing} is missing.*`zmqrl keys"):
        Security.load(keys)


def test_load_of_an_unknown_client_name_names_its_file(keys: Path) -> None:
    with pytest.raises(SecurityError, match=r"nobody\.key_secret is missing"):
        Security.load(keys, client="nobody")


def test_load_warns_about_a_secret_key_other_users_can_read(
    keys: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (keys / "client.key_secret").chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="zmqrl.security"):
        Security.load(keys)
    assert any("client.key_secret is readable by other users" in r.getMessage() for r in caplog.records)


def test_load_refuses_a_server_secret_that_does_not_match_the_public_key(keys: Path, tmp_path: Path) -> None:
    create_keys(tmp_path / "other")
    (keys / "server.key_secret").write_bytes((tmp_path / "other/server.key_secret").read_bytes())
    with pytest.raises(SecurityError, match="different keys"):
        Security.load(keys)


# --------------------------------------------------------------------------------------------
# What may bind where
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("endpoint", "loopback"),
    [
        ("tcp://127.0.0.1:5555", True),
        ("tcp://127.1.2.3:0", True),
        ("tcp://localhost:5555", True),
        ("tcp://[::1]:5555", True),
        ("tcp://[::ffff:127.0.0.1]:5555", True),
        ("ipc:///tmp/zmqrl.sock", True),
        ("inproc://samples", True),
        ("tcp://0.0.0.0:5555", False),
        ("tcp://*:5555", False),
        ("tcp://[::]:5555", False),
        ("tcp://10.1.2.3:5555", False),
        ("tcp://eth0:5555", False),
        ("tcp://learner.example.org:5555", False),
        ("tcp://127.0.0.1.example.org:5555", False),
        ("udp://127.0.0.1:5555", False),
    ],
)
def test_is_loopback(endpoint: str, loopback: bool) -> None:
    assert is_loopback(endpoint) is loopback


def test_check_bind_allowed_refuses_a_public_plaintext_bind(security: Security) -> None:
    with pytest.raises(SecurityError, match=r"binding samples on tcp://0\.0\.0\.0:5555 exposes.*zmqrl keys"):
        check_bind_allowed("tcp://0.0.0.0:5555", "samples", None, insecure=False)
    check_bind_allowed("tcp://0.0.0.0:5555", "samples", security, insecure=False)
    check_bind_allowed("tcp://127.0.0.1:5555", "samples", None, insecure=False)


def test_check_bind_allowed_with_insecure_warns_once_per_endpoint(caplog: pytest.LogCaptureFixture) -> None:
    endpoint = "tcp://0.0.0.0:45821"  # unique to this test: the warning is once per process
    with caplog.at_level(logging.WARNING, logger="zmqrl.security"):
        check_bind_allowed(endpoint, "weights", None, insecure=True)
        check_bind_allowed(endpoint, "weights", None, insecure=True)
    warnings = [r for r in caplog.records if r.name == "zmqrl.security" and endpoint in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_binding_constructors_refuse_a_public_plaintext_bind_before_opening_a_socket(
    ctx: zmq.Context,
) -> None:
    for make in (sockets.samples_pull, sockets.weights_pub, sockets.heartbeat_pull, sockets.control_pub):
        with pytest.raises(SecurityError, match="exposes"):
            make(ctx, "tcp://0.0.0.0:0", LIMITS)


def test_secured_bind_needs_a_running_authenticator(ctx: zmq.Context, security: Security) -> None:
    with pytest.raises(SecurityError, match="start_authenticator"):
        sockets.samples_pull(ctx, ANY_PORT, LIMITS, security=security)


def test_secured_bind_needs_the_server_secret(
    ctx: zmq.Context, security: Security, auth: AuthenticatorHandle
) -> None:
    with pytest.raises(SecurityError, match="no server secret"):
        sockets.heartbeat_pull(ctx, ANY_PORT, LIMITS, security=outsider(security))


def test_authenticator_is_shared_per_context_and_stops_with_its_last_user(
    ctx: zmq.Context, security: Security, tmp_path: Path
) -> None:
    first = start_authenticator(security, ctx)
    second = start_authenticator(security, ctx)  # e.g. learner and supervisor in one process
    assert second.authenticator is first.authenticator
    create_keys(tmp_path / "other")
    with pytest.raises(SecurityError, match="already authorizes"):
        start_authenticator(Security.load(tmp_path / "other"), ctx)
    first.stop()
    first.stop()  # idempotent
    assert authenticator_running(ctx)
    second.stop()
    assert not authenticator_running(ctx)


# --------------------------------------------------------------------------------------------
# Live: only listed clients get through
# --------------------------------------------------------------------------------------------


def test_encrypted_samples_arrive_with_a_high_water_mark_of_one(
    ctx: zmq.Context, security: Security, auth: AuthenticatorHandle
) -> None:
    """libzmq delivers nothing over CURVE + ZAP at HWM 1 (the shipped CartPole and Pendulum
    configs queue one message): the samples sockets queue at least 2 when encrypted."""
    one = dataclasses.replace(LIMITS, samples_hwm=1)
    pull, endpoint = sockets.samples_pull(ctx, ANY_PORT, one, security=security)
    push = sockets.samples_push(ctx, endpoint, one, security=security)
    for tag in (1, 2, 3):
        assert send_within(push, samples_frames(tag))
    assert actor_ids(receive_expected(pull, 3, quiet=0)) == [1, 2, 3]
    assert pull.getsockopt(zmq.RCVHWM) == push.getsockopt(zmq.SNDHWM) == sockets.CURVE_MIN_SAMPLES_HWM
    for sock in (pull, push):
        sock.close(linger=0)


def test_samples_from_a_listed_client_arrive_and_from_others_never(
    ctx: zmq.Context, security: Security, auth: AuthenticatorHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="zmqrl.security")
    pull, endpoint = sockets.samples_pull(ctx, ANY_PORT, LIMITS, security=security)
    stranger = outsider(security)
    unlisted = sockets.samples_push(ctx, endpoint, LIMITS, security=stranger)
    plaintext = sockets.samples_push(ctx, endpoint, LIMITS)
    # IMMEDIATE: these only queue once a handshake completes, which it never should.
    assert not send_within(unlisted, samples_frames(66), timeout=0.2)
    assert not send_within(plaintext, samples_frames(77), timeout=0.2)
    wait_for_refusal(caplog, stranger.client_public)

    listed = sockets.samples_push(ctx, endpoint, LIMITS, security=security)
    assert send_within(listed, samples_frames(1))
    # The refused ones never queued anything (their sends failed above): nothing can leak later.
    assert actor_ids(receive_expected(pull, 1, quiet=0)) == [1]
    for sock in (pull, unlisted, plaintext, listed):
        sock.close(linger=0)


def test_heartbeats_from_a_listed_client_arrive_and_from_others_never(
    ctx: zmq.Context, security: Security, auth: AuthenticatorHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="zmqrl.security")
    pull, endpoint = sockets.heartbeat_pull(ctx, ANY_PORT, LIMITS, security=security)
    stranger = outsider(security)
    unlisted = sockets.heartbeat_push(ctx, endpoint, LIMITS, security=stranger)
    plaintext = sockets.heartbeat_push(ctx, endpoint, LIMITS)
    # No IMMEDIATE here: these queue at once and must still never be delivered.
    assert send_within(unlisted, [b"from the stranger"])
    assert send_within(plaintext, [b"in plaintext"])
    wait_for_refusal(caplog, stranger.client_public)

    listed = sockets.heartbeat_push(ctx, endpoint, LIMITS, security=security)
    assert send_within(listed, [b"listed"])
    assert receive_expected(pull, 1) == [[b"listed"]]  # and the queued refused ones never follow
    for sock in (pull, unlisted, plaintext, listed):
        sock.close(linger=0)


def test_weights_reach_a_listed_subscriber_and_not_an_unlisted_one(
    ctx: zmq.Context, security: Security, auth: AuthenticatorHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="zmqrl.security")
    pub, endpoint = sockets.weights_pub(ctx, ANY_PORT, LIMITS, security=security)
    stranger = outsider(security)
    unlisted = sockets.weights_sub(ctx, endpoint, LIMITS, security=stranger)
    plaintext = sockets.weights_sub(ctx, endpoint, LIMITS)
    listed = sockets.weights_sub(ctx, endpoint, LIMITS, security=security)
    wait_for_refusal(caplog, stranger.client_public)

    # PUB drops until a subscription arrives, so publish until the listed subscriber hears one.
    end = time.monotonic() + DEADLINE_S
    while not listed.poll(0) and time.monotonic() < end:
        pub.send_multipart([b"weights", b"v1"])
        time.sleep(0.02)
    assert listed.recv_multipart() == [b"weights", b"v1"]
    pub.send_multipart([b"weights", b"v2"])
    assert receive_for(unlisted, QUIET_S) == []
    assert receive_for(plaintext, 0.1) == []
    for sock in (pub, unlisted, plaintext, listed):
        sock.close(linger=0)


def test_a_client_authorized_after_the_authenticator_started_gets_in(
    ctx: zmq.Context, keys: Path, security: Security, auth: AuthenticatorHandle
) -> None:
    pull, endpoint = sockets.heartbeat_pull(ctx, ANY_PORT, LIMITS, security=security)
    create_keys(keys, ["late"])  # authorizes it in the directory the authenticator watches
    late = sockets.heartbeat_push(ctx, endpoint, LIMITS, security=Security.load(keys, client="late"))
    assert send_within(late, [b"late"])
    assert receive_expected(pull, 1, quiet=0) == [[b"late"]]
    for sock in (pull, late):
        sock.close(linger=0)


# --------------------------------------------------------------------------------------------
# Named client keys (transport.key_name) and revoking one
# --------------------------------------------------------------------------------------------


def named_keys(tmp_path: Path, *names: str) -> Path:
    """Keys made the way an operator makes them: `zmqrl keys DIR --client NAME ...`."""
    keys_dir = tmp_path / "keys"
    made = subprocess.run(
        [sys.executable, "-m", "zmqrl", "keys", str(keys_dir), *(a for n in names for a in ("--client", n))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    return keys_dir


def role_security(keys_dir: Path, key_name: str) -> Security:
    """What a role configured with these keys and this key name loads (roles/link.py)."""
    sets = [f"transport.keys_dir={keys_dir}", f"transport.key_name={key_name}"]
    security = transport_security(load_config(None, sets, environ={}))
    assert security is not None
    return security


def test_roles_load_the_client_pair_named_by_transport_key_name(tmp_path: Path) -> None:
    keys_dir = named_keys(tmp_path, "alice", "bob")
    alice, bob = role_security(keys_dir, "alice"), role_security(keys_dir, "bob")
    assert alice.client_public == zmq.auth.load_certificate(keys_dir / "alice.key")[0]
    assert bob.client_public == zmq.auth.load_certificate(keys_dir / "bob.key")[0]
    with pytest.raises(SecurityError, match=r"client\.key_secret is missing"):  # no default pair made
        role_security(keys_dir, "client")


def test_a_bad_key_name_is_a_config_error_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"transport\.key_name: bad client name '\.\./alice'"):
        load_config(None, ["transport.key_name=../alice"], environ={})


def test_a_named_key_gets_in_and_a_revoked_one_is_refused(tmp_path: Path, ctx: zmq.Context) -> None:
    keys_dir = named_keys(tmp_path, "alice", "bob")
    server = role_security(keys_dir, "alice")  # the learner's host holds the server pair too
    with start_authenticator(server, ctx) as auth:
        pull, endpoint = sockets.samples_pull(ctx, ANY_PORT, LIMITS, security=server)
        alice = sockets.samples_push(ctx, endpoint, LIMITS, security=role_security(keys_dir, "alice"))
        assert send_within(alice, samples_frames(1))
        bob = sockets.samples_push(ctx, endpoint, LIMITS, security=role_security(keys_dir, "bob"))
        assert send_within(bob, samples_frames(2))
        assert sorted(actor_ids(receive_expected(pull, 2, quiet=0))) == [1, 2]
        bob.close(linger=0)

        (keys_dir / "authorized" / "bob.key").unlink()  # revoking: read at the next handshake
        bob_again = sockets.samples_push(ctx, endpoint, LIMITS, security=role_security(keys_dir, "bob"))
        assert not send_within(bob_again, samples_frames(3), timeout=0.2)
        wait_until(lambda: auth.denied == 1, DEADLINE_S, "bob's handshake to be refused")
        assert send_within(alice, samples_frames(4))
        # bob_again's send failed (no handshake), so it has nothing queued that could leak later.
        assert actor_ids(receive_expected(pull, 1, quiet=0)) == [4]
        for sock in (pull, alice, bob_again):
            sock.close(linger=0)


# --------------------------------------------------------------------------------------------
# Refused handshakes are counted and logged (rate-limited) with the peer's address
# --------------------------------------------------------------------------------------------


def test_refused_handshakes_are_counted_and_logged_once_with_the_peer_address(
    ctx: zmq.Context, security: Security, auth: AuthenticatorHandle, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="zmqrl.security")
    pull, endpoint = sockets.heartbeat_pull(ctx, ANY_PORT, LIMITS, security=security)
    strangers = [outsider(security) for _ in range(3)]
    pushes = [sockets.heartbeat_push(ctx, endpoint, LIMITS, security=s) for s in strangers]
    for push in pushes:
        push.send(b"let me in", flags=zmq.NOBLOCK)  # no IMMEDIATE: queued, and never delivered
    wait_until(lambda: auth.denied == 3, DEADLINE_S, "three refused handshakes")
    lines = [r.getMessage() for r in caplog.records if "refused a CURVE handshake" in r.getMessage()]
    assert len(lines) == 1, lines  # the first at once; the others wait for the next report
    assert "from 127.0.0.1" in lines[0]
    assert any(s.client_public.decode() in lines[0] for s in strangers)
    assert receive_for(pull, 0.2) == []
    auth.stop()
    assert auth.denied == 3  # still readable for the final stats
    for sock in (pull, *pushes):
        sock.close(linger=0)


def test_denial_reports_say_how_many_were_left_out_since_the_last(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    now = [100.0]
    denials = _Denials(tmp_path, interval=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="zmqrl.security")
    for i in range(5):
        denials.record(f"10.0.0.{i}", "CURVE", "Unknown key", f"KEY{i}")
        now[0] += 1.0
    now[0] += 10.0
    denials.record("10.0.0.9", "CURVE", "Unknown key", "KEY9")
    lines = [r.getMessage() for r in caplog.records]
    assert denials.count == 6 and len(lines) == 2
    assert "from 10.0.0.0" in lines[0] and "KEY0" in lines[0] and "0 more refused" in lines[0]
    assert "from 10.0.0.9" in lines[1] and "4 more refused since the last report, 6 in all" in lines[1]


# --------------------------------------------------------------------------------------------
# Refusals before the authenticator, and heartbeats bound to their key's role (issue 23 items 7, 11)
# --------------------------------------------------------------------------------------------


def test_a_plaintext_client_refused_by_a_curve_server_is_counted_and_logged(
    ctx: zmq.Context, security: Security, auth: AuthenticatorHandle, caplog: pytest.LogCaptureFixture
) -> None:
    """libzmq stops a client without keys at the greeting, before any ZAP request: the
    authenticator never hears of it, so only the server socket's monitor can count it."""
    caplog.set_level(logging.WARNING, logger="zmqrl.security")
    pull, endpoint = sockets.samples_pull(ctx, ANY_PORT, LIMITS, security=security)
    plaintext = sockets.samples_push(ctx, endpoint, LIMITS)
    assert not send_within(plaintext, samples_frames(77), timeout=0.2)
    wait_until(lambda: auth.denied >= 1, DEADLINE_S, "the plaintext client to be counted")
    lines = [r.getMessage() for r in caplog.records if "refused a plaintext handshake" in r.getMessage()]
    assert len(lines) == 1 and "samples socket" in lines[0] and "transport.keys_dir" in lines[0]
    assert receive_for(pull, 0.2) == []
    for sock in (pull, plaintext):
        sock.close(linger=0)


def role_keys(tmp_path: Path) -> dict[str, Security]:
    """The default `zmqrl keys` layout, loaded once per client pair."""
    keys_dir = tmp_path / "roles"
    create_keys(keys_dir)
    return {name: Security.load(keys_dir, name) for name in ("client", "learner", "actor", "evaluator")}


def test_the_supervisor_takes_a_heartbeat_only_from_a_key_bound_to_the_role_it_claims(
    tmp_path: Path, ctx: zmq.Context
) -> None:
    """An actor's key (every actor pod holds it) can no longer end the run as `learner-0 finished`."""
    from zmqrl.transport.control import HeartbeatReceiver, HeartbeatSender
    from zmqrl.transport.control_auth import ControlAuth

    keys = role_keys(tmp_path)
    handle = start_authenticator(keys["client"], ctx)
    pull, endpoint = sockets.heartbeat_pull(ctx, ANY_PORT, LIMITS, security=keys["client"])
    receiver = HeartbeatReceiver(pull, BadMessages("heartbeats"), ControlAuth(curve_identities=True))
    # (key, role claimed, id claimed): only the last two keys may say what they claim.
    claims = [("actor", "learner", 0), ("client", "learner", 0), ("evaluator", "actor", 2)]
    claims += [("actor", "actor", 2), ("learner", "learner", 0)]
    pushes = []
    for key, role, role_id in claims:
        push = sockets.heartbeat_push(ctx, endpoint, LIMITS, security=keys[key])
        pushes.append(push)
        HeartbeatSender(push, role, role_id, interval=1.0).beat("finished", {})
    got: list[tuple[str, int]] = []

    def all_heard() -> bool:
        got.extend((hb.role, hb.id) for hb in receiver.recv_all(50))
        return len(got) + receiver.bad.count >= len(claims)

    wait_until(all_heard, DEADLINE_S, "every heartbeat to arrive or be refused")
    assert sorted(got) == [("actor", 2), ("learner", 0)]
    assert receiver.unauthenticated == receiver.bad.count == 3
    handle.stop()
    for sock in (pull, *pushes):
        sock.close(linger=0)


@pytest.mark.parametrize(
    ("key", "role", "role_id", "allowed"),
    [
        ("learner", "learner", 0, True),
        ("actor", "actor", 7, True),
        ("actor-3", "actor", 3, True),
        ("actor-3", "actor", 4, False),
        ("actor.host-a", "actor", 9, True),
        ("actor", "learner", 0, False),
        ("client", "learner", 0, False),
        ("host-a", "actor", 0, False),
        ("learners", "learner", 0, False),
        ("evaluator", "evaluator", 0, True),
    ],
)
def test_a_key_may_speak_as_the_role_its_name_says(key: str, role: str, role_id: int, allowed: bool) -> None:
    from zmqrl.transport.identity import may_speak_as

    assert may_speak_as(key, role, role_id) is allowed


def test_a_role_whose_key_may_not_speak_as_it_refuses_to_start_and_says_how_to_fix_it(tmp_path: Path) -> None:
    from zmqrl.transport.control_trust import role_control_auth, with_role_key

    keys = role_keys(tmp_path)
    cfg = load_config(None, [f"transport.keys_dir={tmp_path / 'roles'}"])
    assert with_role_key(cfg, "actor", 3).transport.key_name == "actor"  # the default picks the role's pair
    assert with_role_key(cfg, "learner", 0).transport.key_name == "learner"
    with pytest.raises(SecurityError, match=r"zmqrl keys KEYS_DIR --client learner"):
        role_control_auth(cfg, keys["actor"], "learner", 0)
    with pytest.raises(SecurityError, match="may not speak as actor-0"):
        role_control_auth(cfg, keys["client"], "actor", 0)
    role_control_auth(cfg, keys["actor"], "actor", 0)
