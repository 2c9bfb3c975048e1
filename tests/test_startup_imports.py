"""What each role's start-up imports: the CLI, the supervisor, the actor and the evaluator never load
torch at import (they act with numpy policies; the evaluator loads it to write a checkpoint, or
for a policy that plays with it), and nothing at import loads torch._dynamo. Each check runs in
a fresh interpreter, since this one may have imported both already."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _loaded(module: str) -> set[str]:
    code = f"import sys, {module}; print(' '.join(m for m in ('torch', 'torch._dynamo') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(out.stdout.split())


# zmqrl.learner.endpoints: the learner process binds its sockets before torch loads (actors connect
# while it imports), so what binds them must not bring torch in.
@pytest.mark.parametrize(
    "module",
    [
        "zmqrl.cli.app",
        "zmqrl.supervisor.launch",
        "zmqrl.actor.main",
        "zmqrl.evaluator.main",
        "zmqrl.learner.endpoints",
    ],
)
def test_roles_without_torch(module: str) -> None:
    assert _loaded(module) == set()


def test_the_learner_loads_torch_but_not_dynamo_at_import() -> None:
    assert _loaded("zmqrl.learner.main") == {"torch"}
