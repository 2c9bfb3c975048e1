"""A stored config's ``env.kwargs`` may not choose code either (issue 37, item 7d): a registered
wrapper env (shimmy's ``GymV21Environment-v0`` with ``env_id: "module:Env"``) imports what a string
in its kwargs names, so every string with a colon in a stored env.kwargs, however deep, is refused
before anything is made, naming its key, unless the caller gives env.kwargs or trusts the file."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest

import zmqrl
from tests import untrusted_code
from tests.test_untrusted_checkpoints import CORRIDOR, MARKER, MARKER_GYM_ID, corridor_checkpoint
from zmqrl.code_trust import CodeGate, UntrustedCode
from zmqrl.config import config_from_dict
from zmqrl.evaluator.greedy import evaluate_checkpoint

# A registered id whose env is made by another id its kwargs name, as shimmy's wrappers are.
WRAPPER_ID = "ZmqrlTestWrapper-v0"


def _wrapper(env_id: str, **kwargs: Any) -> gym.Env[Any, Any]:
    return gym.make(env_id, **kwargs)  # gymnasium imports "module" of "module:Env-v0" here


@pytest.fixture
def wrapper_env() -> Iterator[None]:
    gym.register(WRAPPER_ID, entry_point=_wrapper)  # type: ignore[arg-type]  # any callable is one
    try:
        yield
    finally:
        del gym.envs.registry[WRAPPER_ID]


@pytest.fixture
def record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The file the marker module appends to when imported; it is taken out of sys.modules."""
    path = tmp_path / "imports.log"
    monkeypatch.setenv(untrusted_code.RECORD_ENV, str(path))
    monkeypatch.delitem(sys.modules, MARKER, raising=False)
    return path


def stored(kwargs: object, env_id: str = WRAPPER_ID) -> dict[str, Any]:
    return {"env": {"id": env_id, "kwargs": kwargs}}


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"env_id": MARKER_GYM_ID}, "env.kwargs.env_id"),
        ({"wrappers": [{"entry_point": "os:system"}]}, "env.kwargs.wrappers[0].entry_point"),
        ({"spec": {"inner": {"id": "pkg.mod:Env-v1"}}}, "env.kwargs.spec.inner.id"),
    ],
)
def test_a_string_naming_code_anywhere_in_stored_kwargs_is_refused_naming_its_key(
    kwargs: dict[str, Any], key: str
) -> None:
    with pytest.raises(UntrustedCode) as info:
        config_from_dict(stored(kwargs), "ckpt (stored config)")
    message = str(info.value)
    assert message.startswith(f"ckpt (stored config): {key} "), message
    assert info.value.key == key
    assert "--trust-config" in message and "--set env.kwargs=" in message and "\n" not in message


def test_kwargs_without_a_colon_and_non_strings_pass() -> None:
    kwargs = {"length": 6, "name": "corridor", "sizes": [1, 2.5, None, True], "nested": {"mode": "rgb"}}
    assert config_from_dict(stored(kwargs), "ckpt (stored config)").env.kwargs == kwargs


def test_the_callers_kwargs_and_trust_are_let_through() -> None:
    kwargs = {"env_id": MARKER_GYM_ID}
    assert config_from_dict(stored(kwargs), "ckpt", trusted=True).env.kwargs == kwargs
    given = config_from_dict(stored({"env_id": "os:system"}), "ckpt", overrides=[f"env.kwargs={kwargs}"])
    assert given.env.kwargs == kwargs
    gate = CodeGate("ckpt")
    gate.supply("env.kwargs")
    gate.check("env.kwargs", kwargs)  # no raise: the caller's value


def test_a_checkpoint_of_a_wrapper_env_does_not_import_what_its_kwargs_name(
    tmp_path: Path, wrapper_env: None, record: Path
) -> None:
    path = tmp_path / "best"
    corridor_checkpoint(path, env__id=WRAPPER_ID, env__kwargs={"env_id": MARKER_GYM_ID})
    refused = r"env\.kwargs\.env_id 'tests\.untrusted_code:Trap-v0' may name code to import"
    for load in (lambda: zmqrl.load_policy(path), lambda: evaluate_checkpoint(path, episodes=1)):
        with pytest.raises(UntrustedCode, match=refused):
            load()
        assert MARKER not in sys.modules and not record.exists(), "the stored kwargs' module was imported"
    # The caller's own env settings play it.
    played = evaluate_checkpoint(path, episodes=1, overrides=[f"env.id={CORRIDOR}", "env.kwargs={}"])
    assert len(played.returns) == 1
