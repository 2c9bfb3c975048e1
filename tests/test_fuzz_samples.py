"""The structure-aware fuzz of the samples port (``tests/samples_fuzz.py``) against a live learner
(its intake process: the one samples decoder): valid messages interleaved with mutated ones. The
learner never dies, keeps training and beating, takes exactly what is valid, and its per-sender
accounting stays bounded."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import zmq

from tests import run_state
from tests.conftest import REPO, tiny_config, tiny_overrides, wait_until
from tests.samples_fuzz import SamplesFuzzer
from tests.test_roles import FakeSupervisor, start, with_transport
from zmqrl.learner.main import Learner
from zmqrl.transport.sequence import EXTRA_TRACKED_IDS

MESSAGES = 3000  # in the default suite (a few seconds)


def test_a_live_learner_takes_the_valid_and_counts_the_mutated(ctx: zmq.Context, tmp_path: Path) -> None:
    sup = FakeSupervisor(ctx)
    cfg = with_transport(
        tiny_config(tmp_path, learner__max_updates=10_000_000, learner__min_replay_size=100),
        **sup.endpoints(),
    )
    learner = Learner(cfg, ctx=ctx)
    thread = start(learner.run)
    assert learner.ready.wait(30)
    wait_until(lambda: learner.publisher.version >= 1, 10, "the learner's first publish")
    push = ctx.socket(zmq.PUSH)
    push.connect(learner.endpoints["samples"])
    fuzzer = SamplesFuzzer(seed=1)
    for _ in range(MESSAGES):
        push.send_multipart(fuzzer.next())
    wait_until(
        lambda: learner.receiver.bad.count + learner.batches >= MESSAGES, 60, "every message to be judged"
    )
    assert learner.batches >= fuzzer.made["valid"] and learner.receiver.bad.count > MESSAGES // 4
    beats = len(sup.drain())
    updates = learner.updates
    wait_until(lambda: len(sup.drain()) > beats + 1 and learner.updates > updates, 20, "beats and updates")
    assert thread.is_alive()
    stored = learner.replay.snapshot()
    assert np.isfinite(stored.obs).all() and np.isfinite(stored.reward).all()
    assert set(np.unique(stored.action).tolist()) <= {0, 1} and (stored.discount <= 1).all()
    assert len(learner.receiver.seqs.per_actor()) <= cfg.actor.num_actors + EXTRA_TRACKED_IDS
    learner.request_stop()
    thread.join(timeout=30)
    push.close(0)
    sup.close()
    print(f"\nfuzz: {fuzzer.made}; {learner.batches} taken, {learner.receiver.bad.count} counted bad")


class FuzzPeer:
    """Sends the fuzzer's messages from a thread at about ``rate`` a second until stopped."""

    def __init__(self, ctx: zmq.Context, endpoint: str, rate: float) -> None:
        self.push = ctx.socket(zmq.PUSH)
        self.push.linger = 0
        self.push.connect(endpoint)
        self.fuzzer = SamplesFuzzer(seed=7)
        self.sent = 0
        self._pause = 1.0 / rate
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if self.push.poll(20, zmq.POLLOUT):
                self.push.send_multipart(self.fuzzer.next())
                self.sent += 1
            self._stop.wait(self._pause)

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(timeout=10)
        self.push.close(0)


@pytest.mark.heavy
@pytest.mark.slow
def test_a_launched_cartpole_run_learns_through_the_fuzz_without_losing_its_learner(run_root: Path) -> None:
    """The issue's attack: the shipped CartPole config launched with its supervisor, the fuzz on its
    samples port for the whole run. It used to take the learner down 5 times in 25 s."""
    overrides = [
        item
        for item in tiny_overrides(run_root, run__name="fuzzed")
        if item.split("=")[0].startswith(("run.", "transport.", "supervisor."))
    ]
    overrides += ["actor.num_actors=2", "learner.stop_at_target=true", "learner.max_updates=12000"]
    cmd = [sys.executable, "-m", "zmqrl", "launch", str(REPO / "configs" / "cartpole_dqn.yaml")]
    for item in overrides:
        cmd += ["--set", item]
    run_dir = run_root / "fuzzed"
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ctx = zmq.Context()
    peer: FuzzPeer | None = None
    try:
        samples = run_state.wait_for_launched_endpoints(run_dir, 90, proc)["samples"]
        peer = FuzzPeer(ctx, samples, rate=200)
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
    assert learner["restarts"] == 0, out[-3000:]
    assert peer.sent >= 1000 and learner["bad_messages"] > 0 and learner["nonfinite_updates"] == 0
    assert learner["eval_best"] >= 475, out[-3000:]
    learner_own = json.loads((run_dir / "learner-stats.json").read_text())
    assert len(learner_own["per_actor"]) <= 2 + EXTRA_TRACKED_IDS
    print(
        f"\nthrough the fuzz ({peer.sent} messages: {peer.fuzzer.made}): "
        f"eval best {learner['eval_best']:.1f}, "
        f"{learner['bad_messages']} bad, {learner['updates']} updates, ended {learner['ended']}"
    )
