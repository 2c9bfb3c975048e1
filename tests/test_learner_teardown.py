"""A learner that fails while it is being built still reports and closes what it built (issue 23,
item 11): its trainer, supervisor link and authenticator were built outside its ``try``, so a
failure there left threads and sockets behind and no final heartbeat or stats."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.conftest import REPO, tiny_config
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
    taken = ctx.socket(zmq.PULL)  # someone else holds the samples port: the intake cannot bind it
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    monkeypatch.setattr(learner_module, "Trainer", FakeTrainer)
    FakeTrainer.closed = False
    cfg = tiny_config(
        tmp_path,
        transport__heartbeat=hb_ep,
        transport__control=ctl_ep,
        transport__samples=f"tcp://127.0.0.1:{port}",
    )
    learner = Learner(cfg, ctx=ctx)
    with pytest.raises(BindError, match="address already in use"):
        learner.run()
    taken.close(0)
    assert FakeTrainer.closed, "the trainer's envs and files were left open"
    assert final_state(receiver) == "failed"
    assert learner.link._thread is not None and not learner.link._thread.is_alive()


# A learner process whose main thread fails while its checkpoint writer is inside torch.save.
FAILS_WHILE_WRITING = textwrap.dedent(
    """
    import io, sys, threading, time
    from pathlib import Path
    import torch
    from tests.conftest import tiny_config
    from zmqrl.learner.trainer import Trainer

    cfg = tiny_config(Path(sys.argv[1]))
    trainer = Trainer(cfg, cfg.run_dir)
    writer = trainer.checkpoints.writer
    real_save, inside, big = writer.save, threading.Event(), {"w": torch.zeros(2**21)}

    def slow_save(*args):  # a big checkpoint: a second inside torch.save's C++ code
        inside.set()
        until = time.monotonic() + 1.0
        while time.monotonic() < until:
            torch.save(big, io.BytesIO())
        real_save(*args)

    writer.save = slow_save
    trainer.checkpoints.save_latest()  # in the background, as during training
    inside.wait(30)
    try:
        raise RuntimeError("the learner failed while a checkpoint was being written")
    finally:
        trainer.close()
    """
)


def test_a_learner_that_fails_while_a_checkpoint_is_written_exits_1_not_sigabrt(tmp_path: Path) -> None:
    """The interpreter kills daemon threads as it exits; one inside torch.save dies mid C++ frame
    and takes the process with it (SIGABRT, "terminate called without an active exception"). The
    supervisor then reported a failed learner (exit 1, a bug) as a crash, and a CI run's restart
    test waited for "exited with code 1" in vain. Closing the trainer waits for the write."""
    child = subprocess.run(
        [sys.executable, "-c", FAILS_WHILE_WRITING, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == 1, f"exit {child.returncode}:\n{child.stderr[-3000:]}"
    assert "RuntimeError: the learner failed while a checkpoint was being written" in child.stderr
    assert "terminate called" not in child.stderr
    assert (tmp_path / "t" / "checkpoints" / "latest").is_file(), "the write in flight was finished"
