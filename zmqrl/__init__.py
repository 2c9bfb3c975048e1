"""zmqrl: asynchronous reinforcement learning over ZeroMQ, as processes or as a library.

The Python API (see README "Python API"): ``load_config``, ``train``, ``load_policy``, the
``Config`` dataclasses to build a config in code, and ``register_agent`` for your own algorithm.
Importing zmqrl is cheap: torch is imported only when a run or a policy needs it.
"""

from zmqrl import moved
from zmqrl.agents.registry import AgentPlugin, register_agent
from zmqrl.api import TrainingFailed, TrainResult, load_config, train, validate
from zmqrl.checkpoints.policy import DeployedPolicy, load_policy
from zmqrl.config import Config
from zmqrl.errors import ConfigError

__version__ = "0.1.0"

# Module paths from before the package tree was the architecture still import, with a warning.
moved.install()

__all__ = [
    "AgentPlugin",
    "Config",
    "ConfigError",
    "DeployedPolicy",
    "TrainResult",
    "TrainingFailed",
    "load_config",
    "load_policy",
    "register_agent",
    "train",
    "validate",
]
