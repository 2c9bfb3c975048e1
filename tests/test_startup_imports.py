"""What each role's start-up imports: the CLI, the supervisor and the actor never load torch (the
actor acts with numpy policies), and nothing at import loads torch._dynamo. Each check runs in
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
    "module", ["zmqrl.cli.app", "zmqrl.supervisor.launch", "zmqrl.actor.main", "zmqrl.learner.endpoints"]
)
def test_roles_without_torch(module: str) -> None:
    assert _loaded(module) == set()


@pytest.mark.parametrize("module", ["zmqrl.learner.main", "zmqrl.evaluator.main"])
def test_torch_roles_do_not_load_dynamo_at_import(module: str) -> None:
    assert _loaded(module) == {"torch"}
