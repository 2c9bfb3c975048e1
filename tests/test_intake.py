"""The learner's intake process: samples are received, decoded and checked beside training, not on
its interpreter lock; what the learner takes from it is what it checked; it lives and dies with
its learner, and its failure is the learner's."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zmq

from tests.conftest import REPO, tiny_config, tiny_overrides, wait_until
from tests.test_roles import FakeSupervisor, cartpole_batch, with_transport
from zmqrl.config import TransportConfig
from zmqrl.learner import intake as intake_module
from zmqrl.learner import intake_wire
from zmqrl.learner.intake import IntakeDied, IntakeProcess
from zmqrl.learner.main import Learner
from zmqrl.runtime.health import BAD_LATEST_INFO_KEY
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.bad_messages import BadMessages
from zmqrl.transport.messages import MessageInfo, SampleGroup, SamplesMsg
from zmqrl.types import EpisodeStat, RolloutBatch


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Started:
    """A learner on a thread, its exception kept, with a hand-driven actor socket."""

    def __init__(self, ctx: zmq.Context, tmp_path: Path, **extra: object) -> None:
        self.sup = FakeSupervisor(ctx)
        cfg = tiny_config(tmp_path, learner__max_updates=10**6, learner__min_replay_size=64, **extra)
        self.learner = Learner(with_transport(cfg, **self.sup.endpoints()), ctx=ctx)
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.learner.ready.wait(30)
        wait_until(lambda: self.learner.publisher.version >= 1, 10, "the first publish")
        self.push = ctx.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.connect(self.learner.endpoints["samples"])

    def _run(self) -> None:
        try:
            self.learner.run()
        except BaseException as exc:  # the test reads it
            self.error = exc

    def send(self, seq: int, rows: int = 32) -> None:
        self.push.send_multipart(wire.dump(SamplesMsg(0, seq, 1, cartpole_batch(rows), [])))

    def close(self) -> None:
        self.learner.request_stop()
        self.thread.join(timeout=30)
        self.push.close(0)
        self.sup.close()


def test_samples_reach_replay_through_a_process_of_their_own_and_no_thread_shares_training(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    run = Started(ctx, tmp_path)
    try:
        intake = run.learner.intake
        assert intake.proc.pid != os.getpid() and alive(intake.proc.pid)
        assert not any("ingest" in t.name for t in threading.enumerate()), "no ingest thread any more"
        for seq in range(10):
            run.send(seq)
        wait_until(lambda: run.learner.samples == 320, 20, "the samples in replay")
        wait_until(lambda: run.learner.updates > 10, 20, "training on them")
        seqs = run.learner.receiver.seqs
        wait_until(lambda: seqs.per_actor().get(0, {}).get("batches") == 10, 10, "the intake's report")
    finally:
        run.close()
    assert run.error is None
    assert not alive(intake.proc.pid), "the intake ends with its learner"


def test_why_the_intake_dropped_its_newest_message_reaches_the_learners_heartbeat(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    run = Started(ctx, tmp_path)
    try:
        batch = cartpole_batch(32)
        batch.obs[3, 1] = 1e9  # beyond transport.max_abs_obs
        run.push.send_multipart(wire.dump(SamplesMsg(0, 0, 1, batch, [])))

        def told() -> str:
            beats = [hb for hb in run.sup.drain() if hb.role == "learner"]
            return beats[-1].info.get(BAD_LATEST_INFO_KEY, "") if beats else ""

        wait_until(lambda: "outside" in told(), 20, "the learner's heartbeat to say why")
        assert told().startswith("obs component 1 is 1e+09") and run.learner.intake.bad.count == 1
    finally:
        run.close()
    assert run.error is None


def test_an_intake_that_dies_ends_its_learner_with_a_failure(ctx: zmq.Context, tmp_path: Path) -> None:
    run = Started(ctx, tmp_path)
    try:
        os.kill(run.learner.intake.proc.pid, signal.SIGKILL)
        run.thread.join(timeout=30)
        assert not run.thread.is_alive()
    finally:
        run.close()
    assert isinstance(run.error, IntakeDied) and "exit code -9" in str(run.error)
    assert run.learner.stats["state"] == "failed"


@pytest.mark.slow
def test_a_killed_learner_takes_its_intake_with_it(run_root: Path) -> None:
    """SIGKILL leaves the learner no time to stop anything: the kernel's parent-death signal ends
    the intake, so no process holds the samples port for a restarted learner."""
    cmd = [sys.executable, "-m", "zmqrl", "learner", str(REPO / "configs" / "cartpole_dqn.yaml")]
    for item in tiny_overrides(run_root):
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        children: list[int] = []

        def intake_started() -> bool:
            path = Path(f"/proc/{proc.pid}/task/{proc.pid}/children")
            children[:] = [int(c) for c in path.read_text().split()] if path.exists() else []
            return bool(children)

        wait_until(intake_started, 60, "the learner's intake process")
        proc.kill()
        proc.wait(timeout=10)
        wait_until(lambda: not any(alive(c) for c in children), 10, "the intake to leave with its learner")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_checked_group_crosses_to_the_learner_as_it_was() -> None:
    rng = np.random.default_rng(0)
    transitions = SampleGroup.of(
        [
            SamplesMsg(3, 7, 2, cartpole_batch(5), [EpisodeStat(12.5, 9)], np.full(5, 0.25, np.float32)),
            SamplesMsg(4, 0, 2, cartpole_batch(3), [], np.full(3, 0.5, np.float32)),
        ]
    )
    rollouts = SampleGroup(
        (MessageInfo(1, 2, 3, 0, 2, []),),
        RolloutBatch(
            rng.random((2, 4, 4), dtype=np.float32),
            np.zeros((2, 3), np.int64),
            np.ones((2, 3), np.float32),
            np.zeros((2, 3), bool),
            np.array([[False, True, False], [False, False, False]]),
            np.full((2, 3), -0.7, np.float32),
            rng.random((1, 4), dtype=np.float32),
        ),
        None,
    )
    for group in (transitions, rollouts):
        frames = [bytes(memoryview(f)) for f in intake_wire.dump_group(group)]
        back = intake_wire.load_group(frames)
        assert back.infos == group.infos
        assert type(back.batch) is type(group.batch)
        for ours, theirs in zip(back.batch, group.batch, strict=True):
            if theirs is None:  # a feed-forward rollout's core_state
                assert ours is None
                continue
            assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
        assert (back.priorities is None) == (group.priorities is None)
        if group.priorities is not None:
            assert np.array_equal(back.priorities, group.priorities)


def test_the_spec_crosses_whole() -> None:
    spec = SampleSpec(
        (4,), "float32", (2,), "float32", action_low=(-1.0, -2.0), action_high=1.0,
        obs_low=-np.inf, obs_high=(1.0, 2.0, 3.0, 4.0), rollout_length=16,
    )  # fmt: skip
    sent = intake_wire.load(intake_wire.dump({"spec": intake_wire.spec_to_dict(spec)}))
    assert intake_wire.spec_from_dict(sent["spec"]) == spec


def test_a_port_in_use_is_the_bind_error_it_always_was_and_leaves_nothing_running(
    ctx: zmq.Context, tmp_path: Path
) -> None:
    from zmqrl.learner.endpoints import bind_learner_sockets
    from zmqrl.transport.sockets import BindError

    taken = ctx.socket(zmq.PULL)
    port = taken.bind_to_random_port("tcp://127.0.0.1")
    cfg = tiny_config(tmp_path, transport__samples=f"tcp://127.0.0.1:{port}")
    before = set(Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split())
    started = time.monotonic()
    bound = bind_learner_sockets(cfg, ctx)  # the intake binds while the learner imports torch
    try:
        with pytest.raises(BindError, match=f"127.0.0.1:{port}"):
            bound.samples_endpoint  # noqa: B018 - asked for, the intake's answer is the bind error
    finally:
        bound.close()
    assert time.monotonic() - started < 30
    wait_until(
        lambda: set(Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split()) <= before,
        10,
        "the intake to be gone",
    )
    taken.close(0)


def stuck_intake(monkeypatch: pytest.MonkeyPatch) -> None:
    """An intake that runs but never connects its end of the control channel, as one has that
    closed it on the way out: the learner's orders to it can never go."""
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    monkeypatch.setattr(intake_module, "INTAKE_COMMAND", sleeper)
    monkeypatch.setattr(intake_module, "STOP_SECONDS", 1.0)
    monkeypatch.setattr(intake_module, "TELL_SECONDS", 1.0)


def within(seconds: float, step: Callable[[], object]) -> object:
    """``step()`` on a thread, failing the test (not hanging it) if it does not return in time."""
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(step()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds} s"
    return out[0] if out else None


def test_an_intake_that_takes_no_orders_is_stopped_not_waited_on(
    ctx: zmq.Context, monkeypatch: pytest.MonkeyPatch
) -> None:
    stuck_intake(monkeypatch)
    bad = BadMessages("test", logging.getLogger())
    handle = within(10, lambda: IntakeProcess(ctx, TransportConfig(), bad))
    assert isinstance(handle, IntakeProcess)
    try:
        errors: list[BaseException] = []

        def begin() -> None:
            try:
                handle.begin(SampleSpec((4,), "float32", (), "int64", num_actions=2), 1, 1)
            except IntakeDied as exc:
                errors.append(exc)

        within(10, begin)
        assert errors and "took no order" in str(errors[0])
    finally:
        within(10, handle.close)
    assert handle.proc.poll() is not None, "killed, not left behind"


@pytest.mark.parametrize(
    ("rollout_length", "group_messages", "credits"),
    [(32, 1, 1), (None, 1, intake_wire.SINGLE_CREDITS), (None, 128, 1)],
)
def test_rollouts_are_sent_one_group_ahead_so_each_is_trained_on_by_the_policy_nearest_the_actors(
    rollout_length: int | None, group_messages: int, credits: int
) -> None:
    """Transitions of one message a group may queue a few ahead (the learner finds one whenever it
    looks); rollouts are trained on in turn, each queued one a policy lag of one more update."""
    sent: list[dict[str, object]] = []
    handle = IntakeProcess.__new__(IntakeProcess)  # the order alone: no process
    handle.seqs = intake_module.ReportedSequences(0)
    handle._tell = lambda message, timeout=None: bool(sent.append(intake_wire.load(message)))  # type: ignore[method-assign]
    spec = SampleSpec((4,), "float32", (), "int64", num_actions=2, rollout_length=rollout_length)
    handle.begin(spec, 2, group_messages)
    assert sent[0]["credits"] == credits


def test_messages_with_and_without_priorities_queued_while_the_learner_trains_go_as_two_groups(
    ctx: zmq.Context,
) -> None:
    """While the learner is away (no credit) the intake merges what arrives; a message without
    priorities after ones with them starts a group of its own instead of failing the merge."""
    spec = SampleSpec((4,), "float32", (), "int64", num_actions=2)
    bad = BadMessages("test", logging.getLogger())
    handle = IntakeProcess(ctx, TransportConfig(samples="tcp://127.0.0.1:0"), bad)
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    try:
        push.connect(handle.bound())
        handle.begin(spec, 1, 128)  # merging: one group ahead of what the learner took

        def send(seq: int, priorities: bool) -> None:
            weights = np.full(8, 0.5, np.float32) if priorities else None
            push.send_multipart(wire.dump(SamplesMsg(0, seq, 1, cartpole_batch(8), [], weights)))

        def received(n: int) -> bool:
            handle.read_reports()
            return handle.seqs.per_actor().get(0, {}).get("batches") == n

        send(0, True)  # forwarded at once: the one credit is spent
        wait_until(lambda: received(1), 20, "the first message")
        send(1, True)
        send(2, True)
        send(3, False)  # all three wait: no credit until the learner takes the first group
        wait_until(lambda: received(4), 20, "the three queued messages")
        took: list[SampleGroup] = []

        def take_one() -> bool:
            handle.read_reports()  # IntakeDied if the intake failed (the old one did, merging all three)
            group = handle.take()
            if group is not None:
                took.append(group)
            return len(took) == 3

        wait_until(take_one, 20, "three groups")
        assert [[i.seq for i in g.infos] for g in took] == [[0], [1, 2], [3]]
        assert [g.priorities is not None for g in took] == [True, True, False]
        assert handle.proc.poll() is None
    finally:
        push.close(0)
        handle.close()
