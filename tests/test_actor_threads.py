"""An actor whose policy runs in torch (the Nature CNN) gives torch one intra-op thread.

Actors start without torch; the torch policy imports it while it is built. When the thread cap
ran before that import, it found no torch and did nothing: four Pong actors kept torch's default
(a thread per core) and their OpenMP threads spun against each other, ~35 env steps/s per actor
on 2 cores instead of ~300. The check needs a fresh interpreter (no torch yet) and at least 2
cores (torch's default is then more than one thread, so a skipped cap shows).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import tiny_overrides

SCRIPT = textwrap.dedent(
    """
    import sys, threading, time
    import zmq
    from zmqrl.api import load_config
    from zmqrl.actor.main import Actor

    assert "torch" not in sys.modules, "the test needs a process that has not imported torch"
    ctx = zmq.Context()

    def bound(kind):  # stands in for the learner's and the supervisor's sockets
        sock = ctx.socket(kind)
        sock.bind("tcp://127.0.0.1:0")
        return sock.getsockopt_string(zmq.LAST_ENDPOINT)

    endpoints = dict(samples=bound(zmq.PULL), weights=bound(zmq.PUB), heartbeat=bound(zmq.PULL),
                     control=bound(zmq.PUB))
    cfg = load_config(None, [*sys.argv[1:], *(f"transport.{k}={v}" for k, v in endpoints.items())])
    actor = Actor(cfg, 0, ctx=ctx)
    thread = threading.Thread(target=actor.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while actor.steps == 0:  # the policy is built and the env stepped
        assert thread.is_alive() and time.monotonic() < deadline, "the actor never stepped its env"
        time.sleep(0.02)
    import torch
    print("policy", type(actor.agent).__name__, "torch threads", torch.get_num_threads())
    actor.request_stop()
    thread.join(30)
    assert not thread.is_alive()
    ctx.destroy(linger=0)
    """
)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="torch already defaults to one thread on one core")
def test_an_actor_with_a_torch_policy_runs_torch_on_one_thread(tmp_path: Path) -> None:
    overrides = [
        *tiny_overrides(tmp_path),
        "env.id=tests.example_envs:make_frames_env",
        "agent.torso=nature_cnn",
        "actor.envs_per_actor=2",
    ]
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT, *overrides], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "policy DQNAgent torch threads 1" in result.stdout, result.stdout + result.stderr
