"""Module paths from before the package tree was the architecture, importable for one release.

zmqrl 0.1 kept 38 modules loose at the top of the package; they now live in one folder per role
(docs/architecture.md). Code written against an old path (a plugin importing ``zmqrl.acting``, a
notebook importing ``zmqrl.deploy``) keeps working: the old name is an alias of the module that
holds the code now, and importing it warns once with the new name. The aliases go in the next
release. ``zmqrl.envs`` and ``zmqrl.cli`` are packages now, and forward their old attributes
themselves (their ``__init__``).

A package that left zmqrl whole (:data:`MOVED_PACKAGES`) forwards itself and every module under
it by prefix; zmqrl imports the new package only when someone imports an old path (``zmqrl.bench``
is ``zmqrl_bench`` now, tooling that a runtime-only install lacks: there the old path fails as the
new one does, with ModuleNotFoundError).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType

# Old dotted path -> the module that holds its code now.
MOVED: dict[str, str] = {
    "zmqrl.acting": "zmqrl.actor.sampler",
    "zmqrl.actor_ids": "zmqrl.actor.ids",
    "zmqrl.agents.deferred": "zmqrl.agents.updates",
    "zmqrl.agents.finite": "zmqrl.agents.updates",
    "zmqrl.agents.numpy_views": "zmqrl.agents.numpy_policies",
    "zmqrl.agents.sync": "zmqrl.agents.numpy_policies",
    "zmqrl.checkpoint": "zmqrl.checkpoints.files",
    "zmqrl.cli_launch": "zmqrl.cli.launch",
    "zmqrl.cli_plot": "zmqrl.cli.plot",
    "zmqrl.cli_roles": "zmqrl.cli.roles",
    "zmqrl.cli_status": "zmqrl.cli.status",
    "zmqrl.deploy": "zmqrl.checkpoints.policy",
    "zmqrl.deploy_choice": "zmqrl.checkpoints.choice",
    "zmqrl.env_ids": "zmqrl.envs.ids",
    "zmqrl.evaluating": "zmqrl.evaluator.scoring",
    "zmqrl.evaluation": "zmqrl.evaluator.greedy",
    "zmqrl.exploration": "zmqrl.actor.exploration",
    "zmqrl.fingerprint": "zmqrl.transport.fingerprint",
    "zmqrl.guard": "zmqrl.runtime.guard",
    "zmqrl.health": "zmqrl.runtime.health",
    "zmqrl.learning.checkpointing": "zmqrl.learner.checkpointing",
    "zmqrl.learning.ingest": "zmqrl.learner.ingest",
    "zmqrl.learning.nonfinite": "zmqrl.learner.nonfinite",
    "zmqrl.learning.reporting": "zmqrl.learner.reporting",
    "zmqrl.learning.state": "zmqrl.learner.ingest",
    "zmqrl.learning.trainer": "zmqrl.learner.trainer",
    "zmqrl.learning.versions": "zmqrl.learner.versions",
    "zmqrl.memory": "zmqrl.replay.memory",
    "zmqrl.minatar": "zmqrl.envs.minatar",
    "zmqrl.monitoring.fields": "zmqrl.supervisor.snapshot_fields",
    "zmqrl.monitoring.live": "zmqrl.supervisor.live",
    "zmqrl.monitoring.render": "zmqrl.supervisor.render",
    "zmqrl.monitoring.snapshot": "zmqrl.supervisor.snapshot",
    "zmqrl.monitoring.status": "zmqrl.supervisor.status",
    "zmqrl.plotting": "zmqrl.cli.plotting",
    "zmqrl.roles.actor": "zmqrl.actor.main",
    "zmqrl.roles.evaluator": "zmqrl.evaluator.main",
    "zmqrl.roles.learner": "zmqrl.learner.main",
    "zmqrl.roles.supervisor": "zmqrl.supervisor.launch",
    "zmqrl.roles.watcher": "zmqrl.supervisor.watch",
    "zmqrl.rundirs": "zmqrl.supervisor.rundirs",
    "zmqrl.snapshots": "zmqrl.checkpoints.snapshots",
    "zmqrl.supervision.beacon": "zmqrl.supervisor.beacon",
    "zmqrl.supervision.link": "zmqrl.runtime.link",
    "zmqrl.supervision.liveness": "zmqrl.supervisor.liveness",
    "zmqrl.supervision.monitor": "zmqrl.supervisor.monitor",
    "zmqrl.supervision.oversight": "zmqrl.supervisor.oversight",
    "zmqrl.supervision.processes": "zmqrl.supervisor.processes",
    "zmqrl.supervision.restarts": "zmqrl.supervisor.restarts",
    "zmqrl.supervision.summary": "zmqrl.supervisor.summary",
    "zmqrl.supervision.watchdog": "zmqrl.runtime.watchdog",
    "zmqrl.testhooks": "zmqrl.runtime.testhooks",
    "zmqrl.transport.groups": "zmqrl.transport.sample_channel",
    "zmqrl.learning": "zmqrl.learner",
    "zmqrl.roles": "zmqrl.runtime",
    "zmqrl.supervision": "zmqrl.supervisor",
    "zmqrl.monitoring": "zmqrl.supervisor",
}

# Old package -> the package that holds it now, outside zmqrl: ``zmqrl.bench.report`` ->
# ``zmqrl_bench.report``.
MOVED_PACKAGES: dict[str, str] = {
    "zmqrl.bench": "zmqrl_bench",
}


def moved_to(name: str) -> str | None:
    """The module that holds the code of the old path ``name`` now, or None if it did not move."""
    new = MOVED.get(name)
    if new is not None:
        return new
    for old, package in MOVED_PACKAGES.items():
        if name == old or name.startswith(old + "."):
            return package + name[len(old) :]
    return None


class _Alias(importlib.abc.Loader):
    """Hands back the new module under the old name, after a DeprecationWarning."""

    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        warnings.warn(
            f"{spec.name} moved to {self.new}; the old path goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(self.new)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was executed under its new name."""


class _MovedFinder(importlib.abc.MetaPathFinder):
    """Finds only the old paths (:func:`moved_to`); every other import goes to the normal finders."""

    def find_spec(
        self, name: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        new = moved_to(name)
        if new is None:
            return None
        return importlib.machinery.ModuleSpec(name, _Alias(new))


def install() -> None:
    """Puts the finder first on ``sys.meta_path``, once (zmqrl/__init__ calls it).

    First, because an old package's alias is a new package: ``zmqrl.monitoring.status`` would
    otherwise be found by the path finder in supervisor/ and run a second time under the old name."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())


def forward(package: str, name: str, table: dict[str, str]) -> object:
    """The old attribute ``name`` of a module that became ``package``, from its new module."""
    target = table.get(name)
    if target is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(
        f"{package}.{name} moved to {target}.{name}; the old path goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )
    return getattr(importlib.import_module(target), name)
