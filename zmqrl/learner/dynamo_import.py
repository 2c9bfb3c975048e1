"""Keeping ``torch._dynamo``'s import off the learner's start-up path.

torch (2.x, 2.13 included) imports ``torch._dynamo`` (sympy, the FX shape machinery: about 0.7 s
on a busy 2-core machine, a quarter of a CartPole launch) the first time an optimizer method
wrapped by ``torch._disable_dynamo`` runs, and ``Optimizer.__init__`` calls one
(``add_param_group``). The wrapper only marks the method "not to be traced by dynamo", which
means nothing while no dynamo is loaded. So until ``torch._dynamo`` is imported, those methods
run as they are; once it is (by :func:`preload_in_background`, torch.compile, or the first
``optimizer.step()``, which imports it itself), torch's own wrapper takes over again.

The learner builds its agent (and optimizer) with the import deferred, binds its sockets and
publishes its first weights, then imports ``torch._dynamo`` on a thread while it waits for the
actors' first ``learner.min_replay_size`` transitions: the import overlaps the warm-up instead
of delaying the first weights by its length.
"""

from __future__ import annotations

import importlib
import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("zmqrl.learner")

DYNAMO = "torch._dynamo"
# The attribute torch's ``_disable_dynamo`` wrapper caches its real wrapper under, on the function
# it wraps (torch/_compile.py); when it is set, the wrapper calls it without importing anything.
CACHE_ATTR = "__dynamo_disable"
# The Optimizer methods wrapped that way (torch/optim/optimizer.py).
OPTIMIZER_METHODS = ("add_param_group", "zero_grad", "state_dict", "load_state_dict")


def defer_dynamo_import() -> list[str]:
    """Let torch.optim's wrapped Optimizer methods run without importing ``torch._dynamo`` while
    it is not loaded. Returns the methods that now defer it (none when dynamo is already
    loaded, or when this torch's wrappers are not the ones described above: then nothing is
    changed and torch behaves as it always did)."""
    if DYNAMO in sys.modules:
        return []
    import torch.optim

    deferred: list[str] = []
    for name in OPTIMIZER_METHODS:
        wrapped = getattr(getattr(torch.optim.Optimizer, name, None), "__wrapped__", None)
        if wrapped is None or not callable(wrapped) or hasattr(wrapped, CACHE_ATTR):
            continue
        setattr(wrapped, CACHE_ATTR, _until_dynamo_loads(wrapped))
        deferred.append(name)
    return deferred


def _until_dynamo_loads(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` itself while ``torch._dynamo`` is not loaded (nothing can be tracing it then); from
    the first call after it is loaded, torch's own ``torch._dynamo.disable(fn)``, cached in
    ``fn``'s attribute exactly as torch caches it."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if DYNAMO not in sys.modules:
            return fn(*args, **kwargs)
        # Loaded, or being loaded by another thread: import_module waits for it to finish.
        dynamo = importlib.import_module(DYNAMO)
        disabled = dynamo.disable(fn, True, wrapping=False)
        setattr(fn, CACHE_ATTR, disabled)
        return disabled(*args, **kwargs)

    return call


def preload_in_background() -> threading.Thread | None:
    """Import ``torch._dynamo`` on a daemon thread (None when it is loaded already). A failure
    is logged and ignored: the first ``optimizer.step()`` imports it again and raises there."""
    if DYNAMO in sys.modules:
        return None

    def load() -> None:
        started = time.perf_counter()
        try:
            importlib.import_module(DYNAMO)
        except Exception as exc:  # the main thread's own import reports it
            log.debug("importing %s in the background failed: %s", DYNAMO, exc)
            return
        log.debug("%s imported in the background in %.2f s", DYNAMO, time.perf_counter() - started)

    thread = threading.Thread(target=load, name="dynamo-import", daemon=True)
    thread.start()
    return thread
