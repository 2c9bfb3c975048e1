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

A registered id is made by :func:`gym_make`, whose failures (an unknown id, a missing optional
package) become one EnvError naming the extra to install.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from zmqrl.code_trust import MODULE_SEPARATOR
from zmqrl.envs.minatar import missing_message as missing_minatar_message
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


# What to run when an optional dependency is missing. Atari: zmqrl's `atari` extra (ale-py, which ships
# the ROMs, and OpenCV for the resize); MuJoCo: the `mujoco` extra is exactly gymnasium's; MinAtar:
# zmqrl's `minatar` extra (MINATAR_INSTALL_HINT, from zmqrl.envs.minatar); Box2D is no extra of ours, so
# its own packages are named.
ATARI_INSTALL_HINT = 'pip install -e ".[atari]"'
ATARI_PACKAGES = "pip install ale-py opencv-python-headless"
MUJOCO_INSTALL_HINT = 'pip install "gymnasium[mujoco]"'
BOX2D_INSTALL_HINT = 'pip install swig "gymnasium[box2d]"'

# Words in a DependencyNotInstalled message that point at one of the extras. Gymnasium's messages
# name the missing package, so matching the text covers every id without a hardcoded list.
_MUJOCO_WORDS = ("mujoco",)
_ATARI_WORDS = ("ale_py", "ale-py", "atari", "opencv", "cv2")
_BOX2D_WORDS = ("box2d", "swig")
# Ids of the MinAtar games mention it (MinAtar/Breakout-v1, minatar:...): offered its install line.
_MINATAR_WORD = "minatar"


def gym_make(env_id: str, kwargs: dict[str, Any]) -> gym.Env[Any, Any]:
    """``gymnasium.make`` with its many failure types turned into one EnvError that says what to do."""
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as exc:
        raise EnvError(missing_dependency_message(env_id, exc)) from None
    except gym.error.UnregisteredEnv as exc:
        raise EnvError(_minatar_message(env_id, exc) or unknown_id_message(env_id, exc)) from None
    except ImportError as exc:  # gymnasium's "module:Env-v0" form, whose module is missing
        message = _minatar_message(env_id, exc) or f"env.id '{env_id}' could not be made: {exc}"
        raise EnvError(message) from None
    except (gym.error.Error, TypeError) as exc:
        raise EnvError(f"env.id '{env_id}' could not be made: {exc}") from None


def missing_dependency_message(env_id: str, exc: Exception) -> str:
    """Point at the project's extra for a missing package, read off gymnasium's own message."""
    text = str(exc).lower()
    if any(word in text for word in _MUJOCO_WORDS):
        return f"env.id '{env_id}' needs MuJoCo: run `{MUJOCO_INSTALL_HINT}` ({exc})"
    if any(word in text for word in _ATARI_WORDS):
        return (
            f"env.id '{env_id}' needs the Atari dependencies: run `{ATARI_INSTALL_HINT}` in the zmqrl "
            f"checkout (or `{ATARI_PACKAGES}`) ({exc})"
        )
    if any(word in text for word in _BOX2D_WORDS):
        return f"env.id '{env_id}' needs Box2D, which is not installed: run `{BOX2D_INSTALL_HINT}`"
    return f"env.id '{env_id}' needs a package that is not installed: {exc}"


def _minatar_message(env_id: str, exc: Exception) -> str | None:
    """For a MinAtar id that failed because MinAtar is not installed: what to install (else None)."""
    if _MINATAR_WORD not in env_id.lower():
        return None
    try:
        import minatar  # noqa: F401
    except ImportError:
        return missing_minatar_message(env_id)
    return None
