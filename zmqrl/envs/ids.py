"""What ``env.id`` names: a registered gymnasium id, or an import path to your own env factory.

Why both: gymnasium's registry is the common currency (``CartPole-v1``, ``ALE/Pong-v5``), but an
env of your own should not need a ``gymnasium.register`` call that every process (learner, each
actor, the evaluator) would have to run before the config is read. An import path,
``mypackage.envs:make_env``, is resolved afresh in each process, so whatever that process can
import it can train on. The factory is called with ``env.kwargs`` as keyword arguments, exactly as
``gymnasium.make`` would get them, and must return a ``gymnasium.Env``.

The two forms are told apart by what follows the last colon: a Python attribute path
(``make_env``, ``factories.corridor``) is a factory; anything else (``Env-v0`` in gymnasium's own
``module:Env-v0`` form, which imports a module that registers ids) goes to ``gymnasium.make``.
Every failure is an :class:`EnvError` naming ``env.id`` and what to change.

Both colon forms import code, so neither may come from data: the config parser refuses them in a
config stored in a checkpoint unless the operator gave ``env.id`` or trusts that file
(:mod:`zmqrl.code_trust`); a registered id (no colon) is made from anywhere.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from zmqrl.code_trust import MODULE_SEPARATOR
from zmqrl.errors import EnvError

# Separates the module from the factory's name in an import path, as in entry points; the same
# colon by which the config parser tells an id that imports code (zmqrl.code_trust).
FACTORY_SEPARATOR = MODULE_SEPARATOR
# The form an error message shows when it points at the import-path alternative.
FACTORY_EXAMPLE = "mypackage.envs:make_env"
# Registered ids offered as "did you mean" for an unknown one (difflib's ratio, 0..1).
CLOSE_MATCHES = 3
CLOSE_MATCH_CUTOFF = 0.6


def is_factory_path(env_id: str) -> bool:
    """Whether ``env_id`` is ``module:attribute`` (an env factory) rather than a gymnasium id."""
    module, sep, attribute = env_id.rpartition(FACTORY_SEPARATOR)
    if not sep or not module:
        return False
    return all(part.isidentifier() for part in attribute.split("."))


def make_from_factory(env_id: str, kwargs: dict[str, Any]) -> gym.Env[Any, Any]:
    """Import the factory ``env_id`` names, call it with ``kwargs``, and check it made an Env.

    The kwargs are checked against the factory's signature before the call, so a misspelt
    ``env.kwargs`` key is a one-line config error, while an exception raised inside the factory
    (a bug in the user's code) keeps its traceback.
    """
    factory = resolve_factory(env_id)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):  # some builtins and C callables have no signature: just call
        signature = None
    if signature is not None:
        try:
            signature.bind(**kwargs)
        except TypeError as exc:
            raise EnvError(
                f"env.id '{env_id}': the factory does not take env.kwargs {sorted(kwargs)}: {exc}"
            ) from None
    env = factory(**kwargs)
    if not isinstance(env, gym.Env):
        raise EnvError(
            f"env.id '{env_id}': the factory returned {type(env).__module__}.{type(env).__qualname__}, "
            "not a gymnasium.Env (a vector env is not accepted either: zmqrl builds its own, see "
            "actor.envs_per_actor)"
        )
    return env


def resolve_factory(env_id: str) -> Callable[..., Any]:
    """The callable ``module:attribute`` names, imported in this process."""
    module_name, _, attribute = env_id.rpartition(FACTORY_SEPARATOR)
    try:
        target: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise EnvError(
            f"env.id '{env_id}': cannot import module '{module_name}' ({exc}); install the package "
            "that holds it or put its directory on PYTHONPATH, in every process of the run "
            "(the `zmqrl` command does not search the current directory)"
        ) from None
    except Exception as exc:  # whatever the user's module raised while importing
        raise EnvError(
            f"env.id '{env_id}': importing module '{module_name}' failed: {type(exc).__name__}: {exc}"
        ) from exc
    for part in attribute.split("."):
        if not hasattr(target, part):
            public = [name for name in dir(target) if not name.startswith("_")]
            matches = difflib.get_close_matches(part, public, n=CLOSE_MATCHES, cutoff=CLOSE_MATCH_CUTOFF)
            hint = f" (did you mean {', '.join(repr(m) for m in matches)}?)" if matches else ""
            raise EnvError(
                f"env.id '{env_id}': module '{module_name}' has no attribute '{attribute}'{hint}; "
                f"env.id must name an env factory as 'module:function' (e.g. '{FACTORY_EXAMPLE}')"
            )
        target = getattr(target, part)
    if not callable(target):
        raise EnvError(
            f"env.id '{env_id}': '{attribute}' in module '{module_name}' is a "
            f"{type(target).__name__}, not a callable that makes an env"
        )
    return target


def unknown_id_message(env_id: str, exc: Exception) -> str:
    """Why ``gymnasium.make`` found no such id, with the registered ids closest to it and the
    import-path form for an env of one's own."""
    matches = difflib.get_close_matches(
        env_id, list(gym.registry), n=CLOSE_MATCHES, cutoff=CLOSE_MATCH_CUTOFF
    )
    hint = f" (did you mean {', '.join(repr(m) for m in matches)}?)" if matches else ""
    return (
        f"env.id '{env_id}' could not be made: no such registered gymnasium id{hint} ({exc}); "
        f"for an environment of your own give an import path to its factory, e.g. "
        f"'{FACTORY_EXAMPLE}' (called with env.kwargs)"
    )
