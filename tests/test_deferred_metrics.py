"""An update's metrics and TD errors are computed when read, once, and describe their own update.

The learner reads metrics every ``log_interval`` updates and TD errors only with prioritized
replay; deferring them must not change what they say (the pre-step values of that update), even
when they are read after later updates.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from tests import test_dqn, test_sac
from zmqrl.agents.updates import DeferredUpdate


def test_the_values_are_computed_on_first_read_and_only_once() -> None:
    calls = []

    def compute() -> tuple[list[torch.Tensor], torch.Tensor]:
        calls.append(1)
        return [torch.tensor(1.5), torch.tensor(-2.0)], torch.tensor([0.25, 0.5])

    metrics = DeferredUpdate(("loss", "q_mean"), compute)
    assert set(metrics) == {"loss", "q_mean"} and len(metrics) == 2 and not calls  # names are free
    assert metrics["loss"] == 1.5 and calls == [1]
    assert dict(metrics) == {"loss": 1.5, "q_mean": -2.0}
    np.testing.assert_array_equal(metrics.td_errors, np.array([0.25, 0.5], np.float32))
    assert metrics.td_errors.dtype == np.float32 and calls == [1]
    assert all(isinstance(v, float) for v in metrics.values())


def test_before_any_update_there_are_no_metrics_and_no_td_errors() -> None:
    nothing = DeferredUpdate()
    assert dict(nothing) == {} and nothing.td_errors.shape == (0,)


AGENTS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "dqn": (test_dqn.make_agent, test_dqn.fake_batch),
    "dqn-dueling-no-double": (
        lambda seed: test_dqn.make_agent(seed, dueling=True, double=False),
        test_dqn.fake_batch,
    ),
    "sac": (test_sac.make_sac, test_sac.fake_batch),
}


@pytest.mark.parametrize("kind", AGENTS)
def test_metrics_read_after_later_updates_still_describe_their_own_update(kind: str) -> None:
    make, batch = AGENTS[kind]
    eager, lazy = make(seed=3), make(seed=3)  # twins: the same weights, the same draws
    first, second = batch(seed=5), batch(seed=6)

    result = eager.update(first)
    read_at_once = dict(result.metrics)
    td_at_once = result.td_errors.copy()
    kept = lazy.update(first)
    lazy.update(second)  # a later step changes the networks; the kept metrics must not follow

    assert isinstance(kept, DeferredUpdate)
    assert dict(kept) == read_at_once
    np.testing.assert_array_equal(kept.td_errors, td_at_once)
