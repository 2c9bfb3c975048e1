"""What a supervised run checks before it starts any process: the settings people get wrong first.

Each would otherwise be a learner's (or every role's) failure at start-up, found in a log's last
lines: a tracker whose package is missing, a fixed health port every role would bind, the
learner's ports held by another process (the supervisor's own are bound right after), an env that
cannot be made (an unknown id, with close matches; a missing optional extra), messages the
learner would refuse whole for their size (the learner's own spec says), a CUDA device that is
absent. ``zmqrl launch`` prints the problem in one line and exits; ``zmqrl.train`` raises it.
"""

from __future__ import annotations

from dataclasses import dataclass

from zmqrl.config import Config


@dataclass(frozen=True)
class Problem:
    """One line saying what is wrong and what to do; ``setting``: a value of the config to change
    (exit 2, ``ConfigError``), else the machine's state (a port someone holds: exit 1)."""

    message: str
    setting: bool = True


def preflight_problem(cfg: Config) -> Problem | None:
    """The first problem of ``cfg`` on this machine, in the order above; None when there is none."""
    from zmqrl.envs.factory import EnvError, make_env
    from zmqrl.errors import ConfigError
    from zmqrl.learner.data import learner_spec
    from zmqrl.metrics.trackers import missing_tracker
    from zmqrl.runtime.http_probe import shared_host_problem
    from zmqrl.transport.sockets import address_in_use_message, tcp_port_taken

    if problem := missing_tracker(cfg.logging.backends) or shared_host_problem(cfg):
        return Problem(problem)
    for what in ("samples", "weights"):
        endpoint = getattr(cfg.transport, what)
        if tcp_port_taken(endpoint):
            return Problem(address_in_use_message(what, endpoint), setting=False)
    try:
        env = make_env(cfg.env)
    except EnvError as exc:
        return Problem(" ".join(str(exc).split()))
    try:
        learner_spec(cfg, env)
    except ConfigError as exc:
        return Problem(str(exc))
    finally:
        env.close()
    device = str(getattr(cfg.agent, "device", "cpu"))
    if device.startswith("cuda"):  # only then is torch worth importing here
        from zmqrl.agents.builtin import device_problem

        if problem := device_problem(device):
            return Problem(problem)
    return None
