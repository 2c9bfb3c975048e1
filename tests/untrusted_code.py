"""A module that writes down that it was imported: what a checkpoint from elsewhere might name.

Tests put its names into a checkpoint's stored config (``env.id: tests.untrusted_code:make_env``,
``agent.kind: tests.untrusted_code:PLUGIN``) and check that loading the checkpoint imports nothing
unless the caller opts in. The record goes to the file named by ``$UNTRUSTED_CODE_RECORD``, so a
``zmqrl eval`` subprocess reports an import too. Importing it is the point: so the work happens at
import time, which a real module should never do. Its factory and plugin are the test package's
corridor and linear agent, so a trusted load of it plays normally.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.example_envs import Corridor
from tests.example_envs import make_env as _corridor
from tests.plugins.linear_q import PLUGIN

# The environment variable naming the file each import appends a line to.
RECORD_ENV = "UNTRUSTED_CODE_RECORD"

__all__ = ["PLUGIN", "RECORD_ENV", "make_env"]

if os.environ.get(RECORD_ENV):
    with Path(os.environ[RECORD_ENV]).open("a") as _record:
        _record.write(f"imported by pid {os.getpid()}\n")


def make_env(length: int = 6, max_steps: int = 25) -> Corridor:
    """The example corridor, made through this module."""
    return _corridor(length=length, max_steps=max_steps)
