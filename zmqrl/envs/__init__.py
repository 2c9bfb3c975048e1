"""Environments: the factory built from config, what ``env.id`` may name, the MinAtar adapter."""

from __future__ import annotations

# ``zmqrl.envs`` was one module before it was a package: its names still resolve, with a warning.
_OLD_NAMES = {
    name: "zmqrl.envs.factory"
    for name in ("make_env", "make_vector_env", "sample_spec", "action_bounds", "OneHotObservation")
}


def __getattr__(name: str) -> object:
    from zmqrl.moved import forward

    return forward(__name__, name, _OLD_NAMES)
