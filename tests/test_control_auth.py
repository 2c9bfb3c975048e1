"""The control plane's authentication without Curve keys: MAC, replay, the run's token and the role
keys derived from it (issue 23 item 7, issue 37 item 5: a token per role).

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
    FIXED_BYTES,
    HEARTBEAT,
    MAC_BYTES,
    ControlAuth,
    ReplayGuard,
    Unauthenticated,
    seal,
    unseal,
)
from zmqrl.transport.control_keys import (
    CONTROL_TOKEN_ENV,
    KEY_ROLES,
    KeySource,
    TokenError,
    new_token_text,
    role_key_path,
    write_role_keys,
)
from zmqrl.transport.control_trust import supervisor_control_auth
from zmqrl.transport.wire import HeartbeatMsg

LIMITS = sockets.SocketLimits(linger_ms=0)
KEY = b"k" * 32


def header(role: str = "learner", state: str = "finished") -> list[bytes]:
    return [bytes(f) for f in wire.dump(HeartbeatMsg(role, 0, 1, 0.0, state, {}, {}))]


def token(tmp_path: Path, name: str = "t", role: str | None = None) -> KeySource:
    """The supervisor's source of a fresh token file (``role`` None), or a role's deriving from it."""
    path = tmp_path / name
    if not path.exists():
        path.write_text(new_token_text())
        path.chmod(0o600)
    return KeySource(None, path, role=role)


def learner_key(name: str) -> bytes | None:
    return KEY if name == "learner" else None


def test_a_sealed_message_opens_once_and_never_again() -> None:
    guard = ReplayGuard()
    sealed = seal({"learner": KEY}, header(), now=1000.0)
    assert len(sealed[0]) == FIXED_BYTES + 1 + len("learner") + MAC_BYTES
    assert unseal(learner_key, sealed, now=1001.0, guard=guard) == ("learner", header())
    with pytest.raises(Unauthenticated, match="replayed"):
        unseal(learner_key, sealed, now=1002.0, guard=guard)


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
    sealed = seal({"learner": KEY}, header(), now=1000.0)
    with pytest.raises(Unauthenticated):
        unseal(learner_key, tamper(sealed), now=1000.0, guard=ReplayGuard())  # type: ignore[operator]


def test_another_runs_key_and_a_stale_message_are_refused() -> None:
    with pytest.raises(Unauthenticated, match="bad MAC"):
        unseal(lambda _: b"other" * 8, seal({"learner": KEY}, header(), now=1000.0), 1000.0, ReplayGuard())
    with pytest.raises(Unauthenticated, match="off this host's clock"):
        unseal(learner_key, seal({"learner": KEY}, header(), now=1000.0), 1000.0 + 61, ReplayGuard())


def test_a_mac_for_a_name_the_receiver_does_not_check_is_no_mac() -> None:
    sealed = seal({"actor": KEY}, header(), now=1000.0)
    with pytest.raises(Unauthenticated, match="no MAC this receiver can check"):
        unseal(learner_key, sealed, now=1000.0, guard=ReplayGuard())
    envelope = sealed[0]
    two_entries = envelope[: FIXED_BYTES - 1] + b"\x02" + envelope[FIXED_BYTES:]  # says two, has one
    for broken in (envelope[:-1], envelope + b"x", two_entries):
        with pytest.raises(Unauthenticated):
            unseal(learner_key, [broken, *sealed[1:]], now=1000.0, guard=ReplayGuard())


def test_the_replay_guard_forgets_nonces_past_the_window_and_holds_at_most_its_capacity() -> None:
    guard = ReplayGuard(window=10.0, capacity=100)
    for i in range(1000):
        guard.admit(float(i) / 100, i.to_bytes(16, "little"), now=float(i) / 100)
    assert len(guard._seen) <= 100


def test_directions_have_keys_of_their_own(tmp_path: Path) -> None:
    """A heartbeat recorded off the wire cannot be played to the roles as a control message."""
    auth = ControlAuth(token(tmp_path, role="actor"))
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
    HeartbeatSender(push, "actor", 1, 1.0, auth=ControlAuth(token(tmp_path, "other", "actor"))).beat(
        "running", {}
    )
    HeartbeatSender(push, "actor", 2, 1.0, auth=ControlAuth(KeySource(None, tokens.path, role="actor"))).beat(
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
        sockets.control_sub(ctx, endpoint, LIMITS),
        BadMessages("ctl"),
        auth=ControlAuth(KeySource(None, tokens.path, role="learner")),
    )
    forger = ControlPublisher(pub)  # no token
    supervisor = ControlPublisher(pub, ControlAuth(tokens))
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
        auth=ControlAuth(KeySource(None, path, role="actor")),
    )
    sender.beat("running", {})
    assert sender.unsent == 1 and not pull.poll(200)
    path.write_text(new_token_text())
    receiver = HeartbeatReceiver(pull, BadMessages("hb"), ControlAuth(KeySource(None, path)))
    sender.beat("running", {})
    assert [hb.id for hb in receiver.recv_all(5000)] == [0]


def test_a_token_that_is_no_token_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad"
    bad.write_text("not hex")
    with pytest.raises(TokenError, match="zmqrl keys --token FILE"):
        KeySource(None, bad).token()
    with pytest.raises(TokenError, match="fewer than 16"):
        KeySource("abcd", None)


def test_launch_writes_a_fresh_private_token_per_run_and_gives_its_children_only_role_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(CONTROL_TOKEN_ENV, raising=False)
    cfg = load_config(None, [f"run.dir={tmp_path}", "run.name=r"])
    auth, launched = supervisor_control_auth(cfg, None, launching=True)
    path = cfg.run_dir / "control.token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert auth.keys is not None and auth.keys.token() is not None
    # The config the children read names their keys, never the token.
    assert launched.transport.control_token_file is None
    keys_dir = Path(str(launched.transport.control_keys_dir))
    assert keys_dir == cfg.run_dir / "control-keys"
    for role in ("learner", "actor", "evaluator"):
        key = role_key_path(keys_dir, role)
        assert stat.S_IMODE(key.stat().st_mode) == 0o600 and path.read_text().strip() not in key.read_text()
    first, first_key = path.read_text(), role_key_path(keys_dir, "actor").read_text()
    supervisor_control_auth(cfg, None, launching=True)
    assert path.read_text() != first, "every run gets a secret of its own"
    assert role_key_path(keys_dir, "actor").read_text() != first_key, "and role keys that follow it"
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


def role_auths(tmp_path: Path) -> tuple[ControlAuth, dict[str, ControlAuth]]:
    """The supervisor's authentication (the token) and each role's, reading only its own key file."""
    supervisor = token(tmp_path, "control.token")
    secret = supervisor.token()
    assert secret is not None
    keys_dir = tmp_path / "control-keys"
    write_role_keys(secret, keys_dir)
    roles = {r: ControlAuth(KeySource(None, None, keys_dir, role=r)) for r in KEY_ROLES}
    return ControlAuth(supervisor), roles


def test_an_actors_key_cannot_forge_the_learners_finished(tmp_path: Path) -> None:
    supervisor, roles = role_auths(tmp_path)
    forged = roles["actor"].seal(header("learner", "finished"), HEARTBEAT)
    assert forged is not None
    signer, _ = supervisor.open(forged, HEARTBEAT, ReplayGuard())  # a valid MAC, the actor's...
    assert signer == "actor"
    with pytest.raises(Unauthenticated, match="signed with the actor's control key"):
        supervisor.check_speaker(None, signer, "learner", 0)  # ...which may not speak as the learner
    # Nor can it claim the learner's name in the envelope: it does not hold that key.
    actor_mac = forged[0][-MAC_BYTES:]
    relabelled = [forged[0][:FIXED_BYTES] + b"\x07learner" + actor_mac, *forged[1:]]
    with pytest.raises(Unauthenticated):
        supervisor.open(relabelled, HEARTBEAT, ReplayGuard())
    real = roles["learner"].seal(header("learner", "finished"), HEARTBEAT)
    assert real is not None
    signer, _ = supervisor.open(real, HEARTBEAT, ReplayGuard())
    supervisor.check_speaker(None, signer, "learner", 0)


def test_the_supervisors_stop_reaches_every_role_and_an_actors_reaches_only_actors(tmp_path: Path) -> None:
    supervisor, roles = role_auths(tmp_path)
    stop = [bytes(f) for f in wire.dump(wire.StopMsg("run finished"))]
    sealed = supervisor.seal(stop, CONTROL)
    assert sealed is not None
    for auth in roles.values():
        assert auth.open(sealed, CONTROL, ReplayGuard())[1] == stop
    from_actor = roles["actor"].seal(stop, CONTROL)
    assert from_actor is not None
    for name in ("learner", "evaluator"):
        with pytest.raises(Unauthenticated, match="no MAC this receiver can check"):
            roles[name].open(from_actor, CONTROL, ReplayGuard())


def test_a_role_refuses_a_key_file_that_is_another_roles_or_no_key(tmp_path: Path) -> None:
    role_auths(tmp_path)
    keys_dir = tmp_path / "control-keys"
    (keys_dir / "actor" / "control.key").write_text((keys_dir / "learner" / "control.key").read_text())
    with pytest.raises(TokenError, match="holds the learner's control key, not the actor's"):
        KeySource(None, None, keys_dir, role="actor").own_key()
    (keys_dir / "actor" / "control.key").write_text(new_token_text())
    with pytest.raises(TokenError, match="not a zmqrl role key"):
        KeySource(None, None, keys_dir, role="actor").own_key()


def test_zmqrl_keys_writes_role_keys_from_a_token(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from zmqrl.cli.app import app

    token_file, keys_dir = tmp_path / "control.token", tmp_path / "roles"
    result = CliRunner().invoke(app, ["keys", "--token", str(token_file), "--role-keys", str(keys_dir)])
    assert result.exit_code == 0, result.output
    supervisor = ControlAuth(KeySource(None, token_file))
    actor = ControlAuth(KeySource(None, None, keys_dir, role="actor"))
    sealed = actor.seal(header("actor", "running"), HEARTBEAT)
    assert sealed is not None and supervisor.open(sealed, HEARTBEAT, ReplayGuard())[0] == "actor"
    again = CliRunner().invoke(app, ["keys", "--token", str(token_file)])
    assert again.exit_code != 0 and "refusing to replace" in again.output
