"""What one agent update yields: an optimiser step that never applies a non-finite loss or
gradient, and the update's metrics and TD errors, computed when someone reads them.

Both are the two halves of an agent's ``update()`` result (:class:`DeferredUpdate`): whether the
step was skipped, and what the step measured. Written once here for every agent.

Non-finite steps. One NaN or infinity in a loss or a gradient turns every parameter an Adam step
touches NaN, for good: the learner would publish NaN weights that every actor drops, and
checkpoint them. Whatever validation lets through (a finite but huge reward or observation, an
overflow in the network's own arithmetic), an agent's update therefore checks its loss and
gradients and skips the step when any is not finite.

The check runs on the device, as torch's gradient scaler does it: one fused kernel flags
non-finite values in the gradients and the loss (or, when clipping computed the gradient norm
anyway, the norm is checked). On an accelerator the skip stays there too: a fused Adam given the
flag (``found_inf``) returns without writing parameters or moments and puts its step count back,
so a step costs no host synchronisation and the agent reads its flags once per update, at its
end (it must know whether to move its target networks). On a CPU nothing runs ahead of the host,
so reading a flag waits for nothing, while ``found_inf`` costs Adam an extra pass: there the
host reads the flag and steps or not (docs/performance.md, "Figures behind the agents' code").

Deferred metrics. The learner reads an update's scalar metrics once every ``learner.log_interval``
updates, and its per-row ``|TD error|`` only with prioritized replay. Computed eagerly, a small
network's metrics (a few tensor ops and a device-to-host copy) are a real share of its update on
a CPU, and on a GPU they force a synchronisation per update. The agents keep the pre-step tensors
(detached) and this turns them into python floats on first read, in one device-to-host transfer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch

# torch's own non-finite check over a list of tensors (the gradient scaler's); it also multiplies
# them by a scale, given here as 1. A private name, so looked up once with a fallback.
_CHECK_AND_UNSCALE = getattr(torch, "_amp_foreach_non_finite_check_and_unscale_", None)

_ONES: dict[torch.device, torch.Tensor] = {}

# Whether a step was skipped: a python bool on a CPU (read at once: it waits for nothing), a 0-d
# tensor on an accelerator (read once per update, by `any_found`).
Flag = bool | torch.Tensor
# An update's metrics, computed when called: 0-d tensors in the agent's names' order, and the
# rows' |TD error| (B,) (zeros where nothing is prioritized).
Metrics = Callable[[], tuple[list[torch.Tensor], torch.Tensor]]
# An agent's update on its inputs by name (device tensors) -> its steps' skip flags and metrics.
# The bool says it runs captured (zmqrl.agents.capture): flags stay on the device, state changes
# in place.
UpdateStep = Callable[[Mapping[str, torch.Tensor], bool], tuple[list[Flag], Metrics]]


def backward_step(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Sequence[torch.Tensor],
    max_grad_norm: float = 0.0,
    *,
    also: torch.Tensor | None = None,
    after: Flag = False,
    captured: bool = False,
) -> tuple[Flag, torch.Tensor]:
    """Back-propagate ``loss`` into fresh gradients of ``params`` and take :func:`guarded_step`;
    returns its flag and the gradients' 2-norm before clipping (a metric, on the device, unread)."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    found, norm = guarded_step(optimizer, loss, params, max_grad_norm, also, after, captured)
    if norm is None:  # clipping off: a norm of the norms is 2 ops, not N
        with torch.no_grad():
            grads = [p.grad for p in params if p.grad is not None]
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    return found, norm


def guarded_step(
    optimizer: torch.optim.Optimizer,
    loss: torch.Tensor,
    params: Sequence[torch.Tensor],
    max_grad_norm: float = 0.0,
    also: torch.Tensor | None = None,
    after: Flag = False,
    captured: bool = False,
) -> tuple[Flag, torch.Tensor | None]:
    """Clip (``max_grad_norm`` > 0) and step ``optimizer`` on the gradients ``loss.backward()``
    left in ``params``, unless ``loss``, a gradient or ``also`` (a 0-d tensor that must be finite
    too) holds a NaN or infinity, or ``after`` (the flag of a step this one depends on) is set.

    Returns ``(found, grad_norm)``: ``found`` true (or a non-zero tensor) when the step was
    skipped; ``grad_norm`` the gradients' 2-norm before clipping when clipping computed it, else
    None, on the device and unread.

    ``captured`` (an update run as a CUDA graph, or its code on a CPU: ``zmqrl.agents.capture``):
    the flag stays a device tensor on a CPU too, and nothing reads the host.
    """
    found: Flag
    host = loss.device.type == "cpu" and not captured
    if max_grad_norm > 0:
        norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        # The norm is finite exactly when every gradient is (or their squares overflowed: a
        # step that large is refused too); with the loss, one sum to check (inf - inf is NaN).
        total = loss.detach() + norm if also is None else loss.detach() + norm + also.detach()
        found = not math.isfinite(total.item()) if host else ~torch.isfinite(total)
    else:
        norm = None
        # The kernel scales what it checks in place (by 1 here): the loss after its backward
        # pass, or a sum made for the check, never a tensor a later backward pass needs.
        losses = loss.detach() if also is None else loss.detach() + also.detach()
        checked = [p.grad for p in params if p.grad is not None]
        checked.append(losses.reshape(1))
        found = nonfinite_flag(checked, host)
    if isinstance(found, bool) and isinstance(after, bool):
        found = found or after
    elif not (isinstance(after, bool) and not after):
        found = torch.logical_or(torch.as_tensor(found), torch.as_tensor(after, device=loss.device))
    step_unless(optimizer, found)
    return found, norm


def nonfinite_flag(tensors: list[torch.Tensor], host: bool | None = None) -> Flag:
    """Whether any of ``tensors`` (all on one device) holds a NaN or infinity, as a :data:`Flag`:
    read on the host when ``host`` (None: when they are on a CPU), else a device tensor."""
    device = tensors[-1].device
    if _CHECK_AND_UNSCALE is not None:
        found = torch.zeros((), device=device)
        one = _ONES.get(device)
        if one is None:
            one = _ONES[device] = torch.ones((), device=device)
        _CHECK_AND_UNSCALE(tensors, found, one)
    else:
        found = ~torch.stack([torch.isfinite(t).all() for t in tensors]).all()
    return bool(found.item()) if (device.type == "cpu" if host is None else host) else found


def step_unless(optimizer: torch.optim.Optimizer, found: Flag) -> None:
    """``optimizer.step()`` unless ``found`` (as :func:`nonfinite_flag` returns it) is set."""
    if isinstance(found, bool):
        if not found:
            optimizer.step()
    elif optimizer.defaults.get("fused"):
        # Read by fused Adam's step (its `_step_supports_amp_scaling`): at 1.0, the kernel
        # returns without writing, and the step count is put back.
        optimizer.found_inf = found.to(torch.float32)  # type: ignore[attr-defined]
        try:
            optimizer.step()
        finally:
            del optimizer.found_inf  # type: ignore[attr-defined]
    elif not found.item():
        optimizer.step()


def any_found(flags: Sequence[Flag]) -> bool:
    """Whether any of the flags is set: one host read for all the tensors among them."""
    tensors = [f.to(torch.bool) for f in flags if isinstance(f, torch.Tensor)]
    if any(f for f in flags if isinstance(f, bool)):
        return True
    return bool(torch.stack(tensors).any().item()) if tensors else False


class DeferredUpdate(Mapping[str, float]):
    """``update()``'s result (a :class:`~zmqrl.core.UpdateResult`): its metrics, as this read-only
    mapping itself, and the batch's ``|TD error|`` per row.

    ``compute`` returns the scalar metrics (0-d tensors, in ``names`` order) and the per-row TD
    errors ``(B,)``; it runs at most once, under ``torch.no_grad``, the first time either is read.
    Without ``compute`` (before an agent's first update) there are no metrics and no TD errors.

    ``skipped`` (read eagerly: the agent synchronised once to know it) says the update changed
    nothing because its loss or a gradient held NaN or infinity (:func:`guarded_step`); its
    metrics and TD errors are then those of the refused step, non-finite ones included.
    """

    def __init__(
        self,
        names: Sequence[str] = (),
        compute: Callable[[], tuple[list[torch.Tensor], torch.Tensor]] | None = None,
        *,
        skipped: bool = False,
    ) -> None:
        self.skipped = skipped
        self._names = tuple(names) if compute is not None else ()
        self._compute = compute
        self._values: dict[str, float] = {}
        self._td_errors = np.zeros(0, dtype=np.float32)

    @classmethod
    def of_values(cls, names: Sequence[str], host: np.ndarray, *, skipped: bool) -> DeferredUpdate:
        """A result already on the host (a captured update's output, ``zmqrl.agents.capture``):
        ``host`` holds the metrics in ``names`` order, then the TD errors per row."""
        result = cls(skipped=skipped)
        n = len(names)
        result._names = tuple(names)
        result._values = dict(zip(result._names, host[:n].tolist(), strict=True))
        result._td_errors = host[n:]
        return result

    def _materialize(self) -> None:
        if self._compute is None:
            return
        with torch.no_grad():
            scalars, td_abs = self._compute()
            host = torch.cat([torch.stack(scalars), td_abs.float()]).cpu().numpy()
        self._compute = None  # let go of the tensors it held
        n = len(self._names)
        self._values = dict(zip(self._names, host[:n].tolist(), strict=True))
        self._td_errors = host[n:]

    @property
    def metrics(self) -> Mapping[str, float]:
        """The scalar metrics (this mapping: reading one computes them all)."""
        return self

    @property
    def td_errors(self) -> np.ndarray:
        """``|TD error|`` per row ``(B,)`` float32, before the update's step."""
        self._materialize()
        return self._td_errors

    def __getitem__(self, key: str) -> float:
        self._materialize()
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)
