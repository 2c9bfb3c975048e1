"""Which secret-file modes warn (zmqrl/transport/secret_files.py): open to other users always; open
to a group only unless it is what an orchestrator's mounted secret gives (read for the group, the
file root's, the group one of the process's), so Kubernetes' projected secrets at 0440 no longer
make every role warn while a secret key the user left group-readable on a shared host still does."""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from zmqrl.transport import secret_files
from zmqrl.transport.control_keys import KeySource, write_token_file
from zmqrl.transport.keys import Security, create_keys
from zmqrl.transport.secret_files import exposure

OURS, OTHER = 2000, 3000  # the process's fsGroup, and a group it is not in
ME, ROOT = 1000, 0


def fake_stat(mode: int, uid: int, gid: int) -> os.stat_result:
    return os.stat_result((stat.S_IFREG | mode, 1, 1, 1, uid, gid, 64, 0, 0, 0))


@pytest.mark.parametrize(
    ("mode", "uid", "gid", "warns"),
    [
        (0o600, ME, OTHER, None),
        (0o400, ROOT, OTHER, None),
        (0o440, ROOT, OURS, None),  # Kubernetes: defaultMode 0440, fsGroup
        (0o640, ROOT, OURS, None),  # the same with the owner's write bit
        (0o440, ROOT, OTHER, "its group 3000"),  # a group this process is not in: others' access
        (0o640, ME, OURS, "its group 2000"),  # the user's own file: the group may be everyone's
        (0o660, ROOT, OURS, "its group 2000"),  # the group may change it
        (0o444, ROOT, OURS, "other users"),  # Docker's default for secrets: world-readable
        (0o644, ME, OURS, "other users"),
        (0o604, ME, OURS, "other users"),
    ],
)
def test_the_rule(mode: int, uid: int, gid: int, warns: str | None) -> None:
    assert exposure(fake_stat(mode, uid, gid), groups={ME, OURS}) == warns


def test_the_process_own_groups_count_by_default() -> None:
    assert exposure(fake_stat(0o440, ROOT, os.getegid())) is None


@pytest.fixture
def root_plays_owner(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only root can own a file a test makes as another user: the test's own user plays root (a
    no-op when the tests run as root)."""
    monkeypatch.setattr(secret_files, "ROOT_UID", os.getuid())


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(("mode", "warned"), [(0o440, False), (0o640, False), (0o444, True), (0o660, True)])
def test_a_mounted_secret_key_warns_only_when_open_beyond_its_group(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, root_plays_owner: None, mode: int, warned: bool
) -> None:
    keys = tmp_path / "keys"
    create_keys(keys)
    secret = keys / "client.key_secret"
    os.chown(secret, -1, os.getegid())
    secret.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="zmqrl.security"):
        Security.load(keys)
    found = [m for m in warnings(caplog) if "client.key_secret is readable by" in m]
    assert bool(found) == warned, found
    if warned:
        assert "chmod 600" in found[0] and "0440" in found[0] and f"mode {mode:o}" in found[0]


@pytest.mark.parametrize(("mode", "warned"), [(0o440, False), (0o600, False), (0o604, True)])
def test_the_control_token_file_follows_the_same_rule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, root_plays_owner: None, mode: int, warned: bool
) -> None:
    token = tmp_path / "control.token"
    write_token_file(token)
    token.chmod(mode)
    with caplog.at_level(logging.WARNING, logger="zmqrl.security"):
        assert KeySource(None, token).token() is not None
    assert any("control.token is readable by" in m for m in warnings(caplog)) == warned
