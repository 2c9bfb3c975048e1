"""Roles refuse a learner whose run settings differ (issue 9, item 6): a real learner thread, and an
actor or evaluator with one setting changed, in-process and through the CLI."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq

from tests.conftest import tiny_config
from tests.test_exit_codes import error_lines, role_args, run
from tests.test_roles import FakeSupervisor, start, with_transport
from zmqrl.actor.main import Actor
from zmqrl.config import Config
from zmqrl.evaluator.main import Evaluator
from zmqrl.learner.main import Learner
from zmqrl.metrics import NullLogger
from zmqrl.transport.fingerprint import FingerprintMismatch


class LearnerThread:
    """A real learner that waits for data it will never get, until ``close()``."""

    def __init__(self, ctx: zmq.Context, cfg: Config) -> None:
        self.sup = FakeSupervisor(ctx)
        self.cfg = with_transport(cfg, **self.sup.endpoints())
        self.learner = Learner(self.cfg, ctx=ctx, logger=NullLogger())
        self.thread: threading.Thread = start(self.learner.run)
        assert self.learner.ready.wait(30), "learner did not start"

    def role_config(self, **changed: object) -> Config:
        """The learner's config with ``changed`` settings, pointed at its sockets."""
        base = tiny_config(self.cfg.run.dir, **changed)
        return with_transport(base, **self.learner.endpoints, **self.sup.endpoints())

    def close(self) -> None:
        self.learner.request_stop()
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "learner did not stop"
        self.sup.close()


@pytest.fixture
def learner(ctx: zmq.Context, tmp_path: Path) -> Iterator[LearnerThread]:
    running = LearnerThread(ctx, tiny_config(tmp_path, learner__min_replay_size=5000))
    yield running
    running.close()


def test_an_actor_with_another_n_step_refuses_itself_before_sending_anything(
    ctx: zmq.Context, learner: LearnerThread
) -> None:
    actor = Actor(learner.role_config(agent__n_step=5), 0, ctx=ctx)
    with pytest.raises(FingerprintMismatch) as info:
        actor.run()
    assert info.value.keys == ["agent.n_step"]
    assert str(info.value) == "run settings differ from the learner's: agent.n_step 5 here, 3 at the learner"
    assert actor.stats["state"] == "failed" and actor.stats["samples"] == 0
    assert learner.learner.samples == 0 and learner.learner.receiver.seqs.per_actor() == {}


def test_an_actor_with_the_same_settings_feeds_the_learner(ctx: zmq.Context, learner: LearnerThread) -> None:
    """The control: the fingerprint check passes for an actor of the same run."""
    actor = Actor(learner.role_config(actor__max_steps=200), 0, ctx=ctx)
    stats = actor.run()
    assert stats["state"] == "finished" and stats["samples"] > 0  # it reached actor.max_steps
    assert actor.weights.fingerprint == learner.learner.fingerprint


def test_an_evaluator_with_another_network_refuses_the_learners_weights(
    ctx: zmq.Context, learner: LearnerThread
) -> None:
    evaluator = Evaluator(learner.role_config(agent__hidden_sizes="[16]"), ctx=ctx, logger=NullLogger())
    with pytest.raises(FingerprintMismatch, match=r"agent\.hidden_sizes \[16\] here, \[32, 32\] at the"):
        evaluator.run()
    assert evaluator.stats["state"] == "failed" and evaluator.evaluations == 0


def test_the_actor_command_exits_2_with_one_line_naming_the_differing_setting(
    learner: LearnerThread, tmp_path: Path
) -> None:
    ends = learner.learner.endpoints
    (tmp_path / "actor").mkdir()
    args = role_args(
        tmp_path / "actor",
        "actor",
        f"transport.samples={ends['samples']}",
        f"transport.weights={ends['weights']}",
        "agent.hidden_sizes=[32, 32]",
        "agent.gamma=0.9",
    )
    result = run([sys.executable, "-m", "zmqrl", *args, "--id", "0"])
    assert result.returncode == 2, result.stderr
    assert error_lines(result.stderr) == [
        "error: run settings differ from the learner's: agent.gamma 0.9 here, 0.99 at the learner"
    ]
    assert "Traceback" not in result.stderr
    assert learner.learner.samples == 0
