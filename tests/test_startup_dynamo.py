"""Deferring torch._dynamo's import (zmqrl/learner/dynamo_import.py) changes when it is imported,
never what the optimizer computes. Each side runs in a fresh interpreter: this one may have
imported torch._dynamo already."""

from __future__ import annotations

import json
import subprocess
import sys

# Builds a network and Adam (the agents' fused_adam), checkpoints the optimizer, makes three
# updates, and prints what was loaded when, and the parameters.
SCRIPT = """
import json, sys
import torch
from zmqrl.learner import dynamo_import
deferred = dynamo_import.defer_dynamo_import() if sys.argv[1] == "defer" else []
from zmqrl.agents.nets import fused_adam
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = fused_adam(net.parameters(), lr=0.01)
opt.zero_grad(set_to_none=True)
opt.load_state_dict(opt.state_dict())
before_step = "torch._dynamo" in sys.modules
if sys.argv[2] == "preload":
    dynamo_import.preload_in_background().join()
x = torch.linspace(-1, 1, 12).reshape(3, 4)
for _ in range(3):
    opt.zero_grad(set_to_none=True)
    net(x).pow(2).mean().backward()
    opt.step()
state = opt.state_dict()
opt.load_state_dict(state)
fn = torch.optim.Optimizer.zero_grad.__wrapped__
print(json.dumps({
    "deferred": deferred,
    "dynamo_before_step": before_step,
    "dynamo_after": "torch._dynamo" in sys.modules,
    "cache_is_torchs": getattr(fn, "__dynamo_disable").__module__.startswith("torch"),
    "params": [p.detach().flatten().tolist() for p in net.parameters()],
    "steps": [float(s["step"]) for s in state["state"].values()],
}))
"""


def _run(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, check=True, timeout=120
    )
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_deferred_import_leaves_the_updates_unchanged() -> None:
    reference = _run("plain", "-")
    deferred = _run("defer", "-")
    preloaded = _run("defer", "preload")
    # torch imports dynamo as the optimizer is built; deferred, only at the first step
    assert reference["dynamo_before_step"] is True
    assert deferred["dynamo_before_step"] is False
    assert deferred["deferred"] == ["add_param_group", "zero_grad", "state_dict", "load_state_dict"]
    for side in (deferred, preloaded):
        assert side["dynamo_after"] is True
        assert side["cache_is_torchs"] is True  # once loaded, torch's own wrapper again
        assert side["params"] == reference["params"]
        assert side["steps"] == reference["steps"]


def test_nothing_is_deferred_once_dynamo_is_loaded() -> None:
    import torch._dynamo  # noqa: F401  (loaded: the deferral must leave torch as it is)

    from zmqrl.learner.dynamo_import import defer_dynamo_import, preload_in_background

    assert defer_dynamo_import() == []
    assert preload_in_background() is None
