"""One poisoning peer beside a normal actor (issue 23 item 2), black-box.

The peer speaks the protocol perfectly: its messages decode, fit the run's shapes and dtypes, and
hold only finite numbers, but the numbers are ones the run cannot mean (a reward of 3e38, an
observation of 1e30 where CartPole declares its velocities unbounded, a discount of 1.0, an
episode return of 3e38, a weights version not yet published), or they are valid transitions
whose priorities claim 3e38. Before the fix, one such row wrecked training silently: with
prioritized replay it filled every batch, and it turned every parameter NaN.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from tests import run_state
from tests.conftest import REPO, tiny_config, tiny_overrides, wait_until
from tests.test_roles import FakeSupervisor, start, with_transport
from zmqrl.actor.main import Actor
from zmqrl.learner.main import Learner
from zmqrl.transport import wire
from zmqrl.transport.wire import SamplesMsg
from zmqrl.types import EpisodeStat, TransitionBatch

HUGE = 3e38  # a finite float32
ROWS = 32


def valid_rows(rng: np.random.Generator, n: int = ROWS) -> TransitionBatch:
    obs = rng.uniform(-0.2, 0.2, (n, 4)).astype(np.float32)
    return TransitionBatch(
        obs, rng.integers(0, 2, n), np.ones(n, np.float32), obs.copy(), np.full(n, 0.97, np.float32)
    )


def poisoned(rng: np.random.Generator, kind: int, seq: int, published: int) -> SamplesMsg:
    """One of the peer's unfit messages: every column well-formed, one value the run cannot mean."""
    batch = valid_rows(rng)
    episodes: list[EpisodeStat] = []
    version = 1
    if kind == 0:
        batch = batch._replace(reward=np.full(ROWS, HUGE, np.float32))
    elif kind == 1:
        obs = batch.obs.copy()
        obs[5, 1] = 1e30  # the cart's velocity: declared unbounded
        batch = batch._replace(obs=obs)
    elif kind == 2:
        nxt = batch.next_obs.copy()
        nxt[:, 3] = -1e30
        batch = batch._replace(next_obs=nxt)
    elif kind == 3:
        batch = batch._replace(discount=np.ones(ROWS, np.float32))
    elif kind == 4:
        episodes = [EpisodeStat(HUGE, 10)]
    else:
        version = published + 1000  # from the future: no actor can hold it
    return SamplesMsg(7, seq, version, batch, episodes)


POISON_KINDS = 6


class Peer:
    """A raw PUSH socket sending, in turn, unfit messages and valid rows claiming priority 3e38,
    from a thread, until stopped; counts what it sent."""

    def __init__(
        self, ctx: zmq.Context, endpoint: str, published: Callable[[], int], priorities: bool
    ) -> None:
        self.push = ctx.socket(zmq.PUSH)
        self.push.linger = 0
        self.push.connect(endpoint)
        self._published = published
        self._priorities = priorities
        self.unfit = self.greedy = 0
        self._stop = threading.Event()
        self._rng = np.random.default_rng(11)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        seq = 0
        while not self._stop.is_set():
            if not self.push.poll(20, zmq.POLLOUT):
                continue
            if seq % 2 == 0:
                msg = poisoned(self._rng, (seq // 2) % POISON_KINDS, seq, self._published())
                self.unfit += 1
            else:  # valid rows that claim to be the most urgent ever (bounded by replay)
                prio = np.full(ROWS, HUGE, np.float32) if self._priorities else None
                msg = SamplesMsg(7, seq, 1, valid_rows(self._rng), [], priorities=prio)
                self.greedy += 1
            self.push.send_multipart(wire.dump(msg))
            seq += 1
            self._stop.wait(0.01)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        self.push.close(0)


@pytest.mark.parametrize("prioritized", [False, True])
def test_a_poisoning_peer_beside_a_normal_actor_changes_nothing_but_the_bad_count(
    ctx: zmq.Context, tmp_path: Path, prioritized: bool
) -> None:
    sup = FakeSupervisor(ctx)
    cfg = tiny_config(
        tmp_path,
        replay__prioritized=prioritized,
        learner__max_updates=10**6,
        learner__eval_interval=0,
        learner__checkpoint_interval=100,
    )
    cfg = with_transport(cfg, **sup.endpoints())
    learner = Learner(cfg, ctx=ctx)
    learner_thread = start(learner.run)
    assert learner.ready.wait(30)
    actor = Actor(with_transport(cfg, **learner.endpoints), 0, ctx=ctx)
    actor_thread = start(actor.run)
    peer = Peer(ctx, learner.endpoints["samples"], lambda: learner.trainer.published_version, prioritized)
    try:
        wait_until(
            lambda: learner.updates >= 400 and peer.unfit >= 2 * POISON_KINDS, 90, "training beside the peer"
        )
    finally:
        peer.stop()
    # Once the peer has stopped sending: its last messages may still be on their way, and the
    # intake reports its count every few tenths of a second.
    wait_until(lambda: learner.receiver.bad.count >= peer.unfit, 10, "every unfit message counted")
    assert learner.receiver.bad.count == peer.unfit, "exactly the unfit messages are dropped"
    assert learner_thread.is_alive() and actor_thread.is_alive()
    spec = learner.trainer.spec
    limits = spec.obs_limits()
    assert limits is not None
    stored = learner.replay.snapshot()
    # CartPole's reward is 1 a step: an n-step transition's at most n_step.
    assert np.abs(stored.reward).max() <= cfg.agent.n_step and stored.discount.max() <= np.float32(0.99)
    for column in (stored.obs, stored.next_obs):
        assert (column >= limits[0]).all() and (column <= limits[1]).all()
    state = learner.agent.state_dict()
    assert all(bool(torch.isfinite(t).all()) for t in state["online"].values())
    assert learner.trainer.nonfinite.total == 0
    assert min(learner.trainer.counters.recent_lags) >= 0
    if prioritized:
        stats = learner.replay.stats()
        assert stats["max_priority"] <= learner.replay.max_priority_cap  # type: ignore[attr-defined]
        assert stats["clipped_priorities"] >= ROWS * peer.greedy * 0.9  # every greedy row lowered
    sup.stop()
    learner_thread.join(timeout=60)
    actor_thread.join(timeout=30)
    sup.close()
    assert learner.stats["state"] == "stopped" and learner.stats["bad_messages"] == peer.unfit
    assert learner.stats["nonfinite_updates"] == 0


@pytest.mark.heavy
@pytest.mark.slow
def test_a_cartpole_run_with_prioritized_replay_learns_beside_a_poisoning_peer(run_root: Path) -> None:
    """The issue's run: CartPole with prioritized replay (the shipped config), one peer poisoning
    beside the normal actors. It ended at eval 9 with 0 bad messages; now it learns (a mean eval
    return of at least 400) and counts every unfit message."""
    overrides = [
        item
        for item in tiny_overrides(run_root, run__name="poisoned")
        if item.split("=")[0].startswith(("run.", "transport.", "supervisor."))
    ]
    overrides += ["actor.num_actors=2", "learner.stop_at_target=true", "learner.max_updates=12000"]
    cmd = [sys.executable, "-m", "zmqrl", "launch", str(REPO / "configs" / "cartpole_dqn.yaml")]
    for item in overrides:
        cmd += ["--set", item]
    run_dir = run_root / "poisoned"
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctx = zmq.Context()
    peer: Peer | None = None
    try:
        samples = run_state.wait_for_launched_endpoints(run_dir, 90, proc)["samples"]
        version = [1]
        peer = Peer(ctx, samples, lambda: version[0], priorities=True)
        out, _ = proc.communicate(timeout=240)
    finally:
        if peer is not None:
            peer.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ctx.term()
    assert proc.returncode == 0, out[-3000:]
    stats = json.loads((run_dir / "stats.json").read_text())
    learner = stats["learner"]
    assert learner["bad_messages"] > 0 and learner["nonfinite_updates"] == 0
    assert learner["eval_best"] >= 400, out[-3000:]
    print(
        f"\nbeside a poisoning peer: eval best {learner['eval_best']:.1f}, "
        f"last {learner['eval_return']:.1f}, "
        f"{learner['bad_messages']} bad messages, {learner['clipped_priorities']} priorities clipped, "
        f"{learner['updates']} updates, ended {learner['ended']}"
    )
    assert (
        max(e["mean"] for e in learner.get("eval_history", [])[-3:] or [{"mean": learner["eval_return"]}])
        >= 400
    )


def test_the_peer_really_sends_well_formed_messages() -> None:
    """Every unfit message decodes as samples (it is refused for its values, not its form)."""
    rng = np.random.default_rng(0)
    for kind in range(POISON_KINDS):
        msg = poisoned(rng, kind, kind, 5)
        decoded = wire.load([bytes(f) for f in wire.dump(msg)])
        assert isinstance(decoded, SamplesMsg)
        assert all(np.isfinite(np.asarray(col, np.float64)).all() for col in dataclasses.astuple(decoded)[3])
