"""An update's metrics and TD errors, computed when someone reads them instead of on every update.

The learner reads an update's scalar metrics once every ``learner.log_interval`` updates, and its
per-row ``|TD error|`` only with prioritized replay. Computed eagerly, the CartPole DQN's metrics
(eight small tensor ops and a device-to-host copy) took ~15% of each update on a CPU, and on a GPU
they force a synchronisation per update. The agents keep the pre-step tensors (detached) and this
turns them into python floats on first read, in one device-to-host transfer, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import torch


class DeferredUpdate(Mapping[str, float]):
    """``update()``'s result (a :class:`~zmqrl.core.UpdateResult`): its metrics, as this read-only
    mapping itself, and the batch's ``|TD error|`` per row.

    ``compute`` returns the scalar metrics (0-d tensors, in ``names`` order) and the per-row TD
    errors ``(B,)``; it runs at most once, under ``torch.no_grad``, the first time either is read.
    Without ``compute`` (before an agent's first update) there are no metrics and no TD errors.

    ``skipped`` (read eagerly: the agent synchronised once to know it) says the update changed
    nothing because its loss or a gradient held NaN or infinity (``zmqrl.agents.finite``); its
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
