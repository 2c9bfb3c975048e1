"""A learner that fails while it is being built still reports and closes what it built (issue 23,
item 11): its trainer, supervisor link and authenticator were built outside its ``try``, so a
failure there left threads and sockets behind and no final heartbeat or stats."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.conftest import tiny_config
from zmqrl.learner import endpoints as endpoints_module
from zmqrl.learner import main as learner_module
from zmqrl.learner.main import Learner
from zmqrl.transport.channels import BadMessages
from zmqrl.transport.control import HeartbeatReceiver
from zmqrl.transport.sockets import BindError
from zmqrl.transport.wire import HeartbeatMsg


@pytest.fixture
def supervisor_side(ctx: zmq.Context) -> Iterator[tuple[HeartbeatReceiver, str, str]]:
    hb = ctx.socket(zmq.PULL)
    hb.bind("tcp://127.0.0.1:0")
    ctl = ctx.socket(zmq.PUB)
    ctl.bind("tcp://127.0.0.1:0")
    yield (
        HeartbeatReceiver(hb, BadMessages("test")),
        hb.getsockopt_string(zmq.LAST_ENDPOINT),
        ctl.getsockopt_string(zmq.LAST_ENDPOINT),
    )
    hb.close(linger=0)
    ctl.close(linger=0)


def final_state(receiver: HeartbeatReceiver) -> str | None:
    beats: list[HeartbeatMsg] = []
    for _ in range(50):
        beats += receiver.recv_all(100)
        if any(b.state == "failed" for b in beats):
            return "failed"
    return beats[-1].state if beats else None


def test_a_learner_whose_trainer_fails_to_build_still_says_failed_and_closes_its_link(
    tmp_path: Path,
    ctx: zmq.Context,
    supervisor_side: tuple[HeartbeatReceiver, str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver, hb_ep, ctl_ep = supervisor_side

    def broken(*args: Any, **kwargs: Any) -> None:
        raise ValueError("the trainer could not be built")

    monkeypatch.setattr(learner_module, "Trainer", broken)
    cfg = tiny_config(tmp_path, transport__heartbeat=hb_ep, transport__control=ctl_ep)
    learner = Learner(cfg, ctx=ctx)
    with pytest.raises(ValueError, match="could not be built"):
        learner.run()
    assert final_state(receiver) == "failed", "the supervisor never heard the learner's end"
    assert json.loads((cfg.run_dir / "learner-stats.json").read_text())["state"] == "failed"
    assert learner.link._thread is not None and not learner.link._thread.is_alive()


class FakeTrainer:
    """Enough of a Trainer for run() to get to its sockets."""

    closed = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.agent = None

    def close(self) -> None:
        FakeTrainer.closed = True


def test_a_learner_that_cannot_bind_closes_its_trainer_and_reports(
    tmp_path: Path,
    ctx: zmq.Context,
    supervisor_side: tuple[HeartbeatReceiver, str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver, hb_ep, ctl_ep = supervisor_side

    def port_in_use(*args: Any, **kwargs: Any) -> None:
        raise BindError("cannot bind samples: address already in use")

    monkeypatch.setattr(learner_module, "Trainer", FakeTrainer)
    monkeypatch.setattr(endpoints_module.sockets, "samples_pull", port_in_use)
    FakeTrainer.closed = False
    cfg = tiny_config(tmp_path, transport__heartbeat=hb_ep, transport__control=ctl_ep)
    learner = Learner(cfg, ctx=ctx)
    with pytest.raises(BindError):
        learner.run()
    assert FakeTrainer.closed, "the trainer's envs and files were left open"
    assert final_state(receiver) == "failed"
    assert learner.link._thread is not None and not learner.link._thread.is_alive()
