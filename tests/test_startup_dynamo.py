"""Deferring torch._dynamo's import (zmqrl/learner/dynamo_import.py) changes whether it is
imported, never what the optimizer computes, and torch's own wrappers take over once it is
loaded. Each side runs in a fresh interpreter: this one may have imported torch._dynamo already."""

from __future__ import annotations

import json
import subprocess
import sys

# Builds a network and Adam (the agents' fused_adam), checkpoints the optimizer, makes four
# updates, and prints what was loaded when, and the parameters.
SCRIPT = """
import json, sys
import torch
from zmqrl.learner import dynamo_import
deferred = dynamo_import.defer_dynamo_import() if sys.argv[1] == "defer" else []
adam_step = dynamo_import.defer_adam_step_import() if sys.argv[1] == "defer" else False
from zmqrl.agents.nets import fused_adam
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
opt = fused_adam(net.parameters(), lr=0.01)
opt.zero_grad(set_to_none=True)
opt.load_state_dict(opt.state_dict())
before_step = "torch._dynamo" in sys.modules
x = torch.linspace(-1, 1, 12).reshape(3, 4)
grad_modes = []
for i in range(4):
    if i == 2 and sys.argv[2] == "load":  # something imports dynamo halfway through the run
        import torch._dynamo
    opt.zero_grad(set_to_none=True)
    net(x).pow(2).mean().backward()
    opt.step()
    grad_modes.append(torch.is_grad_enabled())
state = opt.state_dict()
opt.load_state_dict(state)
fn = torch.optim.Optimizer.zero_grad.__wrapped__
print(json.dumps({
    "deferred": deferred,
    "adam_step": adam_step,
    "grad_modes": grad_modes,
    "dynamo_before_step": before_step,
    "dynamo_after": "torch._dynamo" in sys.modules,
    "cache_is_torchs": getattr(fn, "__dynamo_disable", None) is not None
    and getattr(fn, "__dynamo_disable").__module__.startswith("torch"),
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
    loaded_later = _run("defer", "load")
    # torch imports dynamo as the optimizer is built; deferred, never (the updates do not need it)
    assert reference["dynamo_before_step"] is True and reference["dynamo_after"] is True
    assert deferred["deferred"] == ["add_param_group", "zero_grad", "state_dict", "load_state_dict"]
    assert deferred["adam_step"] is True
    assert deferred["dynamo_before_step"] is False and deferred["dynamo_after"] is False
    # loaded halfway by someone else: torch's own wrappers from then on
    assert loaded_later["dynamo_after"] is True and loaded_later["cache_is_torchs"] is True
    for side in (deferred, loaded_later):
        assert side["params"] == reference["params"]
        assert side["steps"] == reference["steps"]
        assert side["grad_modes"] == reference["grad_modes"] == [True] * 4


def test_nothing_is_deferred_once_dynamo_is_loaded() -> None:
    import torch._dynamo  # noqa: F401  (loaded: the deferral must leave torch as it is)

    from zmqrl.learner.dynamo_import import defer_adam_step_import, defer_dynamo_import

    assert defer_dynamo_import() == []
    assert defer_adam_step_import() is False
