"""Keeping ``torch._dynamo``'s import out of the learner: Adam without the compiler's start-up.

torch (2.x, 2.13 included) imports ``torch._dynamo`` (sympy, the FX shape machinery: a large share
of a CartPole launch, docs/performance.md "startup") the first time an optimizer method
wrapped by ``torch._disable_dynamo`` runs (``Optimizer.__init__`` calls one,
``add_param_group``), and on every ``Adam.step`` (to mark graph breaks around it). Both only
tell a compiler what not to trace, which means nothing while no dynamo is loaded: nothing can be
compiling then. So until ``torch._dynamo`` is imported, those methods run without it; once
anything imports it (torch.compile in a plugin agent, say), torch's own wrappers take over again
from their next call. The built-in agents never need it, so a learner never imports it.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Callable
from typing import Any

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


def defer_adam_step_import() -> bool:
    """Let ``torch.optim.Adam.step`` (every built-in agent's optimizer) run without importing
    ``torch._dynamo`` while it is not loaded. torch wraps it so that it sets the grad mode,
    imports ``torch._dynamo`` and marks two graph breaks around the step; a graph break means
    nothing outside a compiled region, and nothing is compiled while dynamo is not loaded. So
    until it is, the step runs with the grad mode set as torch sets it; from then on through
    torch's own wrapper. False (nothing changed) when Adam is already in use, or its step is not
    the wrapper described here."""
    import torch.optim

    current: Any = torch.optim.Adam.__dict__.get("step")
    code = getattr(current, "__code__", None)
    if (
        DYNAMO in sys.modules
        or code is None
        or code.co_name != "_use_grad"  # already hooked, or another torch's wrapper
        or not callable(getattr(current, "__wrapped__", None))
    ):
        return False
    torch.optim.Adam.step = _step_until_dynamo_loads(current)  # type: ignore[method-assign]
    return True


def _step_until_dynamo_loads(wrapper: Callable[..., Any]) -> Callable[..., Any]:
    """torch's ``_use_grad`` step ``wrapper`` while dynamo is loaded, else the same without
    its graph breaks (see :func:`defer_adam_step_import`)."""
    import torch

    step = wrapper.__wrapped__  # type: ignore[attr-defined]

    @functools.wraps(step)
    def deferred(self: Any, *args: Any, **kwargs: Any) -> Any:
        if DYNAMO in sys.modules:
            return wrapper(self, *args, **kwargs)
        grad_was = torch.is_grad_enabled()
        try:
            torch.set_grad_enabled(self.defaults["differentiable"])
            return step(self, *args, **kwargs)
        finally:
            torch.set_grad_enabled(grad_was)

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
