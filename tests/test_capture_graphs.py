"""How a captured update meets its CUDA graph (zmqrl.agents.capture.CapturedUpdate), on a CPU.

A stand-in for the CUDA side keeps its semantics: warm-up runs execute at once, a capture executes
nothing and hands back a replay that runs the recorded step on the same static buffers. With it
the tests check the sequence (warm-up, one capture, replays), what the capture sees (capturable
optimisers, lr tensors), what a failed capture does (auto: eager on, with a warning; on: raise),
that a checkpoint load captures again, and that everything a graph reads stays at its address.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch

from tests.test_captured_updates import appo_batch, dqn_batch, sac_batch, tensors
from zmqrl.agents import capture
from zmqrl.agents.appo import APPOAgent
from zmqrl.agents.capture import CapturedUpdate
from zmqrl.agents.configs import APPOConfig, DQNConfig, SACConfig
from zmqrl.agents.dqn import DQNAgent
from zmqrl.agents.sac import SACAgent
from zmqrl.spec import SampleSpec
from zmqrl.types import Batch, TransitionBatch

torch.set_num_threads(1)

CARTPOLE = SampleSpec((4,), "float32", (), "int64", num_actions=2)
PENDULUM = SampleSpec((3,), "float32", (1,), "float32", action_low=(-2.0,), action_high=(2.0,))


class StandInGraphs:
    """CudaGraphs' two methods on a CPU: ``warm`` runs now; ``capture`` runs nothing and returns
    the replay (the step, run again on the same buffers at each call)."""

    def __init__(self, optimizers: Sequence[torch.optim.Optimizer], fail: bool = False) -> None:
        self.optimizers = optimizers
        self.fail = fail
        self.warmed = 0
        self.captured = 0
        self.replayed = 0
        self.seen: list[tuple[bool, bool]] = []  # (every group capturable, grads all None) per capture

    def warm(self, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        self.warmed += 1
        return run()

    def capture(
        self, run: Callable[[], torch.Tensor], generators: Sequence[torch.Generator]
    ) -> Callable[[], torch.Tensor]:
        self.captured += 1
        groups = [g for opt in self.optimizers for g in opt.param_groups]
        params = [p for g in groups for p in g["params"]]
        self.seen.append((all(g["capturable"] for g in groups), all(p.grad is None for p in params)))
        if self.fail:
            raise RuntimeError("operation not permitted when stream is capturing")

        def replay() -> torch.Tensor:
            self.replayed += 1
            return run()

        return replay


def batch(i: int, n: int = 16) -> TransitionBatch:
    rng = np.random.default_rng(i)
    obs = rng.normal(size=(n, 4)).astype(np.float32)
    next_obs = rng.normal(size=(n, 4)).astype(np.float32)
    return TransitionBatch(
        obs,
        rng.integers(0, 2, n),
        rng.normal(size=n).astype(np.float32),
        next_obs,
        np.full(n, 0.97, np.float32),
    )


def dqn_pair(
    strict: bool = True, fail: bool = False, **overrides: Any
) -> tuple[DQNAgent, DQNAgent, StandInGraphs]:
    """An eager DQN agent and a twin whose updates go through the stand-in graphs."""
    values: dict[str, Any] = {"hidden_sizes": [16], "device": "cpu", "lr_final": 1e-5, "lr_decay_updates": 20}
    values.update(overrides)
    eager = DQNAgent(DQNConfig(capture="never", **values), CARTPOLE, seed=1)
    twin = DQNAgent(DQNConfig(capture="always", **values), CARTPOLE, seed=1)
    graphs = StandInGraphs([twin.optimizer], fail=fail)
    assert twin._captured is not None
    twin._captured = CapturedUpdate(
        twin._learn,
        twin._captured.device,
        [twin.optimizer],
        dtypes=twin._captured._dtypes,
        strict=strict,
        graphs=graphs,  # type: ignore[arg-type]
    )
    return eager, twin, graphs


def assert_same_results(a: Any, b: Any) -> None:
    assert a.skipped == b.skipped
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(b.td_errors, a.td_errors, rtol=1e-5, atol=1e-6)


def test_warm_up_then_one_capture_then_replays_with_the_eager_numbers(
    caplog: pytest.LogCaptureFixture,
) -> None:
    eager, twin, graphs = dqn_pair()
    with caplog.at_level(logging.INFO, logger="zmqrl.agents"):
        for i in range(capture.WARMUP_RUNS + 5):
            assert_same_results(eager.update(batch(i)), twin.update(batch(i)))
    assert caplog.text.count("update captured as a CUDA graph (_learn: obs (16, 4),") == 1
    # The capture ran nothing: its batch is the first replay.
    assert (graphs.warmed, graphs.captured, graphs.replayed) == (capture.WARMUP_RUNS, 1, 5)
    # Captured with capturable optimisers and no gradients (they are allocated in the graph's pool).
    assert graphs.seen == [(True, True)]
    group = twin.optimizer.param_groups[0]
    assert group["capturable"] is False and isinstance(group["lr"], float)  # as eager's state dict says
    assert twin.optimizer.state_dict()["param_groups"] == eager.optimizer.state_dict()["param_groups"]


def test_a_checkpoint_load_captures_again() -> None:
    """Loading replaces the optimiser's state tensors a graph would still write: the next update
    warms up and captures anew."""
    eager, twin, graphs = dqn_pair()
    for i in range(capture.WARMUP_RUNS + 1):
        twin.update(batch(i))
    twin.load_state_dict(eager.state_dict())
    for i in range(capture.WARMUP_RUNS + 2):
        assert_same_results(eager.update(batch(10 + i)), twin.update(batch(10 + i)))
    assert (graphs.warmed, graphs.captured) == (2 * capture.WARMUP_RUNS, 2)


def test_a_failed_capture_goes_on_eagerly_with_a_warning_under_auto(caplog: pytest.LogCaptureFixture) -> None:
    eager, twin, graphs = dqn_pair(strict=False, fail=True)
    with caplog.at_level(logging.WARNING, logger="zmqrl.agents"):
        for i in range(capture.WARMUP_RUNS + 4):
            assert_same_results(eager.update(batch(i)), twin.update(batch(i)))
    assert graphs.captured == 1 and graphs.replayed == 0
    assert twin._captured is not None and twin._captured.graphs is None
    assert "without CUDA graphs: capture failed" in caplog.text
    assert twin.optimizer.param_groups[0]["capturable"] is False


def test_a_failed_capture_raises_under_on() -> None:
    _, twin, _ = dqn_pair(strict=True, fail=True)
    for i in range(capture.WARMUP_RUNS):
        twin.update(batch(i))
    with pytest.raises(RuntimeError, match="stream is capturing"):
        twin.update(batch(9))
    assert twin.optimizer.param_groups[0]["capturable"] is False


def test_an_unfused_optimiser_is_refused_for_graphs() -> None:
    net = torch.nn.Linear(2, 1)
    plain = torch.optim.Adam(net.parameters(), foreach=False)
    graphs = StandInGraphs([plain])
    with pytest.raises(RuntimeError, match="not fused"):
        CapturedUpdate(lambda x: x["a"], torch.device("cpu"), [plain], strict=True, graphs=graphs)  # type: ignore[arg-type]
    lenient = CapturedUpdate(lambda x: x["a"], torch.device("cpu"), [plain], graphs=graphs)  # type: ignore[arg-type]
    assert lenient.graphs is None


# State-dict entries that are copies made by state_dict() itself (the live ones are checked apart).
COPIED = (".log_alpha", ".policy_stats", ".noise")


def held(agent: Any) -> list[int]:
    """The addresses of what a captured update reads besides its inputs: the tensors of the
    agent's state dict (live references: weights, targets, optimiser moments and step counts),
    and SAC's alpha and policy stats."""
    live = [
        t
        for name, t in tensors(agent.state_dict())
        if isinstance(t, torch.Tensor) and not name.endswith(COPIED)
    ]
    if isinstance(agent, SACAgent):
        live += [agent.log_alpha, agent._policy_stats]
    return [t.data_ptr() for t in live]


@pytest.mark.parametrize(
    ("agent", "batches"),
    [
        pytest.param(
            DQNAgent(
                DQNConfig(hidden_sizes=[8], device="cpu", capture="always", target_update_interval=2),
                CARTPOLE,
            ),
            dqn_batch(CARTPOLE),
            id="dqn",
        ),
        pytest.param(
            SACAgent(SACConfig(hidden_sizes=[8], device="cpu", capture="always"), PENDULUM),
            sac_batch,
            id="sac",
        ),
        pytest.param(
            APPOAgent(APPOConfig(hidden_sizes=[8], device="cpu", capture="always", minibatches=2), CARTPOLE),
            appo_batch(CARTPOLE),
            id="appo",
        ),
    ],
)
def test_what_a_graph_reads_stays_at_its_address(agent: Any, batches: Callable[[Any, int], Batch]) -> None:
    """Weights, targets, optimiser moments and step counts, SAC's alpha and policy stats: a graph
    reads them where it captured them, so the captured code changes them in place only."""
    agent.update(batches(agent, 0))  # the optimisers' state exists from the first step on
    before = held(agent)
    assert len(before) > 10
    for i in range(1, 5):
        assert not agent.update(batches(agent, i)).skipped
    assert held(agent) == before
