"""The speed seam: how an agent's update runs, eagerly or recorded once as a CUDA graph and replayed.

An agent writes its update once, as an :data:`UpdateStep` (forward passes, the losses of
``zmqrl.agents.losses``, guarded optimiser steps) and makes one call, :func:`run_update`. Eagerly,
the batch goes to the device, the step runs, its skip flags are read once and its metrics are
left to be computed when read (``zmqrl.agents.updates``). Captured (``agent.capture``), the step
runs on static buffers through :class:`CapturedUpdate`.

Why capture. An eager update is a few hundred small torch operations, each dispatched from Python,
so a GPU learner waits on its own interpreter (docs/performance.md, "Figures behind the agents'
code"). A CUDA graph records the kernels of one update (forward passes, losses, backward passes,
the guarded optimiser steps) and replays them all with one call: per update the host copies the
batch into the graph's input buffers, replays, and reads one small vector back.

What the agents' captured code (their ``captured=True`` path) guarantees, and this module relies on:

- Static addresses. Everything the update reads is at the same address at every replay: the batch
  is copied into buffers made here, the networks and optimiser states change in place only.
- No host read inside. The non-finite checks keep their flags on the device and a fused Adam skips
  its step by ``found_inf`` (``zmqrl.agents.updates``), as on any accelerator.
- One output: the skip flag, the metrics and the per-row TD errors in one float32 vector
  (:func:`packed`), which the host reads once per update, as the eager update already did (a
  skipped update must not move targets nor count, and prioritized replay needs the TD errors).
- Learning rates in device tensors while a graph runs: a float lr would be baked in at capture and
  the annealed schedules would stop moving.

How (torch's CUDA graph rules, ``torch.cuda.graphs``). A few eager runs on a side stream first
(``WARMUP_RUNS``: lazy initialisations, the optimiser's moments), then the capture, which runs
nothing, so the batch that triggered it is replayed at once. The optimisers' ``capturable`` flag is
set only while capturing (torch's capture check reads it; the fused kernel does not), so a state
dict saved by either path is the other's. One graph per input signature (shapes, dtypes and the
agent's variant, e.g. SAC's updates without a policy step), at most ``MAX_GRAPHS`` kept. A
checkpoint load replaces the optimiser's state tensors: the agent calls :meth:`reset`, and the
next update warms up and captures again.

On a CPU (``capture: always``) the same code runs with the same buffers and no graph: what the tests
compare with the eager update, number for number.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from zmqrl.agents.nets import check_importance, on_device
from zmqrl.agents.updates import DeferredUpdate, Flag, Metrics, UpdateStep, any_found
from zmqrl.types import TransitionBatch, as_bytes

# Eager runs of a new signature, on a side stream, before its capture (torch's advice: lazy
# initialisations such as cuBLAS workspaces and the optimiser's state must not happen in a graph).
WARMUP_RUNS = 3
# Graphs kept at once (one per input signature; each holds its own memory pool); beyond, the least
# recently used is dropped.
MAX_GRAPHS = 4
# Stream capture mode: "thread_local" refuses unsafe CUDA calls of the capturing thread only, so a
# learner's other threads (publishing, checkpoints) cannot break a capture by touching the GPU.
CAPTURE_ERROR_MODE = "thread_local"

log = logging.getLogger("zmqrl.agents")


def capture_wanted(mode: str, device: torch.device) -> bool:
    """Whether an agent with ``capture: mode`` (``configs.CAPTURE_MODES``) on ``device`` runs its
    captured update: "auto" on CUDA devices, "always" everywhere, "never" nowhere."""
    if mode == "auto":
        return device.type == "cuda"
    return mode == "always"


def captured_update(
    mode: str,
    step: UpdateStep,
    device: torch.device,
    optimizers: Sequence[torch.optim.Optimizer],
    dtypes: Mapping[str, torch.dtype] | None = None,
    generators: Sequence[torch.Generator] = (),
) -> CapturedUpdate | None:
    """An agent's :class:`CapturedUpdate` under ``agent.capture: mode`` on ``device`` (strict when
    "always"), or None where its updates run eagerly."""
    if not capture_wanted(mode, device):
        return None
    return CapturedUpdate(
        step, device, optimizers, dtypes=dtypes, generators=generators, strict=mode == "always"
    )


def run_update(
    step: UpdateStep,
    arrays: Mapping[str, np.ndarray],
    names: Sequence[str],
    captured: CapturedUpdate | None,
    device: torch.device,
    dtypes: Mapping[str, torch.dtype],
) -> DeferredUpdate:
    """One update: ``step`` on the batch ``arrays`` (by input name; ``dtypes``: the device dtype
    of those that have a fixed one), through ``captured`` where the agent has one, else eagerly.
    The result holds the metrics in ``names`` order and the rows' TD errors, and says whether
    the update was skipped (a NaN or infinity: nothing changed)."""
    if captured is not None:
        host = captured.run(arrays, step)
        return DeferredUpdate.of_values(names, host[1:], skipped=bool(host[0]))
    flags, metrics = step(on_device(arrays, device, dtypes), False)
    # The update's one host read of its flags (on an accelerator each step was skipped, or not,
    # on the device): a skipped update must not move targets nor count, and the learner must know.
    return DeferredUpdate(names, metrics, skipped=any_found(flags))


def transition_inputs(batch: TransitionBatch, importance: np.ndarray | None) -> dict[str, np.ndarray]:
    """A transition batch's columns by name, and prioritized replay's ``importance`` weights
    (checked) when given: a DQN or SAC update's inputs."""
    arrays = dict(batch._asdict())
    if importance is not None:
        check_importance(importance, batch.size)
        arrays["importance"] = np.asarray(importance)
    return arrays


def transition_dtypes(action: torch.dtype) -> dict[str, torch.dtype]:
    """The device dtypes of those inputs (observations keep theirs: uint8 frames cross as bytes)."""
    return {"action": action, "reward": torch.float32, "discount": torch.float32, "importance": torch.float32}


@torch.no_grad()
def packed(flags: Sequence[Flag], metrics: Metrics) -> torch.Tensor:
    """A captured update's one output: ``[found, *scalars, *per_row]`` as float32 ``(1 + S + B,)``
    (``found``: whether any of the skip ``flags``, device tensors here, is set; ``scalars``: the
    0-d ``metrics`` in their names' order; ``per_row``: the ``|TD error|`` per row, or zeros)."""
    if not all(isinstance(f, torch.Tensor) for f in flags):
        raise TypeError("a captured update's skip flags must be device tensors (guarded_step(captured=True))")
    found = torch.stack([torch.as_tensor(f).reshape(()).to(torch.bool) for f in flags]).any()
    scalars, per_row = metrics()
    scalar_values = torch.stack([s.detach().to(torch.float32) for s in scalars])
    return torch.cat([found.to(torch.float32).reshape(1), scalar_values, per_row.detach().to(torch.float32)])


class CudaGraphs:
    """The CUDA side of a captured update: warm-up runs on a side stream, and the capture itself
    (torch.cuda.graphs). A test passes a stand-in with the same two methods."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def warm(self, run: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``run()`` eagerly on a side stream, ordered after and before the current stream's work."""
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            output = run()
        current.wait_stream(side)
        return output

    def capture(
        self, run: Callable[[], torch.Tensor], generators: Sequence[torch.Generator]
    ) -> Callable[[], torch.Tensor]:
        """Record ``run()`` (which runs nothing now) as a graph drawing fresh numbers from
        ``generators`` at each replay; returns the replay, which gives the graph's output tensor."""
        graph = torch.cuda.CUDAGraph()
        for generator in generators:
            graph.register_generator_state(generator)
        with torch.cuda.graph(graph, capture_error_mode=CAPTURE_ERROR_MODE):
            output = run()

        def replay() -> torch.Tensor:
            graph.replay()
            return output

        return replay


@dataclass
class _Signature:
    """The buffers, and once captured the graph, of one input signature."""

    step: UpdateStep  # the agent's update variant run on them
    buffers: dict[str, torch.Tensor]  # the static inputs on the device
    staging: dict[str, np.ndarray]  # where the host writes each batch column (pinned, or the buffer)
    pinned: dict[str, torch.Tensor] = field(default_factory=dict)  # CUDA: the host side of each copy
    runs: int = 0  # eager runs so far (warm-up)
    replay: Callable[[], torch.Tensor] | None = None  # once captured: runs the graph, gives its output


class CapturedUpdate:
    """Runs an agent's :data:`UpdateStep` on each batch: as a CUDA graph replay on CUDA, as plain
    calls on a CPU (or where capture was given up).

    ``optimizers`` are those the step steps (all fused, for a graph); ``dtypes`` the device dtype of
    named inputs (the others keep their array's); ``generators`` the non-default CUDA generators
    the step draws from (registered with each graph, so replays draw fresh numbers). ``strict``
    (``capture: always``): a capture that fails raises; otherwise it is logged and the update goes on
    without graphs.
    """

    def __init__(
        self,
        step: UpdateStep,
        device: torch.device,
        optimizers: Sequence[torch.optim.Optimizer],
        *,
        dtypes: Mapping[str, torch.dtype] | None = None,
        generators: Sequence[torch.Generator] = (),
        strict: bool = False,
        graphs: CudaGraphs | None = None,
    ) -> None:
        self._step = step
        self.device = device
        self._optimizers = list(optimizers)
        self._dtypes = dict(dtypes or {})
        self._generators = list(generators)
        self._strict = strict
        self._signatures: OrderedDict[Hashable, _Signature] = OrderedDict()
        groups = [group for opt in self._optimizers for group in opt.param_groups]
        # Each group's lr as a device tensor, read by the graph (see the module docstring).
        self._lrs = [(group, torch.tensor(float(group["lr"]), device=device)) for group in groups]
        self._lr_values = [float(group["lr"]) for group in groups]
        # None: plain calls (a CPU, or capture given up).
        self.graphs = graphs or (CudaGraphs(device) if device.type == "cuda" else None)
        unfused = [type(opt).__name__ for opt in self._optimizers if not opt.defaults.get("fused")]
        if self.graphs is not None and unfused:
            self._give_up(f"optimisers {unfused} are not fused (their skip would read the host)")

    def run(self, arrays: Mapping[str, np.ndarray], step: UpdateStep | None = None) -> np.ndarray:
        """One update on the batch ``arrays`` (by input name): copies them into the signature's
        buffers, runs or replays the step (``step``: another variant of the agent's update, as a
        bound method, each with its own graph), and returns its packed output on the host."""
        step = step or self._step
        # Records (a Dict observation's) as their bytes: one static uint8 buffer each, as any column.
        arrays = {name: as_bytes(array) for name, array in arrays.items()}
        key = (step, tuple((name, a.shape, a.dtype.str) for name, a in arrays.items()))
        entry = self._signatures.get(key)
        if entry is None:
            entry = self._signatures[key] = self._new_signature(step, arrays)
            while len(self._signatures) > MAX_GRAPHS:
                self._signatures.popitem(last=False)
        else:
            self._signatures.move_to_end(key)
        for name, array in arrays.items():
            np.copyto(entry.staging[name], array, casting="unsafe")
        for name, host in entry.pinned.items():
            entry.buffers[name].copy_(host, non_blocking=True)
        self._update_lrs()
        output = self._execute(entry)
        return output.cpu().numpy()  # the update's one host read (a copy: a replay overwrites it)

    def reset(self) -> None:
        """Drop every graph and buffer (after a checkpoint load replaced the optimisers' state)."""
        self._signatures.clear()

    # ------------------------------------------------------------------------------------ parts

    def _new_signature(self, step: UpdateStep, arrays: Mapping[str, np.ndarray]) -> _Signature:
        buffers: dict[str, torch.Tensor] = {}
        staging: dict[str, np.ndarray] = {}
        pinned: dict[str, torch.Tensor] = {}
        for name, array in arrays.items():
            dtype = self._dtypes.get(name) or torch.from_numpy(np.empty(0, array.dtype)).dtype
            buffers[name] = torch.empty(array.shape, dtype=dtype, device=self.device)
            if self.device.type == "cuda":
                # Pinned, so the copy to the device is a DMA that does not stop the host; reused
                # safely because each update's output read waits for that copy to finish.
                pinned[name] = torch.empty(array.shape, dtype=dtype, pin_memory=True)
                staging[name] = pinned[name].numpy()
            else:
                staging[name] = buffers[name].numpy()
        return _Signature(step, buffers, staging, pinned)

    def _update_lrs(self) -> None:
        for i, (group, tensor) in enumerate(self._lrs):
            value = float(group["lr"])
            if value != self._lr_values[i]:
                tensor.fill_(value)
                self._lr_values[i] = value

    def _execute(self, entry: _Signature) -> torch.Tensor:
        if self.graphs is None:
            return self._call(entry)
        if entry.replay is not None:
            return entry.replay()
        if entry.runs < WARMUP_RUNS:
            entry.runs += 1
            return self.graphs.warm(lambda: self._call(entry))
        return self._capture(entry, self.graphs)

    def _call(self, entry: _Signature) -> torch.Tensor:
        """The step on the entry's buffers, with every group's lr its device tensor meanwhile."""
        floats = [group["lr"] for group, _ in self._lrs]
        for group, tensor in self._lrs:
            group["lr"] = tensor
        try:
            return packed(*entry.step(entry.buffers, True))
        finally:
            for (group, _), value in zip(self._lrs, floats, strict=True):
                group["lr"] = value

    def _capture(self, entry: _Signature, graphs: CudaGraphs) -> torch.Tensor:
        """Record the step as the entry's graph and replay it on the batch already in its buffers."""
        for opt in self._optimizers:
            # Gradients are then allocated in the graph's own memory, at addresses replays keep.
            opt.zero_grad(set_to_none=True)
        groups = [group for opt in self._optimizers for group in opt.param_groups]
        capturable = [group.get("capturable", False) for group in groups]
        for group in groups:
            group["capturable"] = True
        try:
            entry.replay = graphs.capture(lambda: self._call(entry), self._generators)
        except Exception as exc:
            if self._strict:
                raise
            self._give_up(f"capture failed: {exc!r}")
            for opt in self._optimizers:
                opt.zero_grad(set_to_none=True)
            return self._call(entry)  # nothing ran while capturing: this batch, eagerly
        finally:
            for group, flag in zip(groups, capturable, strict=True):
                group["capturable"] = flag
        shapes = ", ".join(f"{name} {tuple(t.shape)}" for name, t in entry.buffers.items())
        log.info("update captured as a CUDA graph (%s: %s)", getattr(entry.step, "__name__", "step"), shapes)
        return entry.replay()

    def _give_up(self, why: str) -> None:
        if self._strict:
            raise RuntimeError(f"agent.capture is 'always' but the update cannot be captured: {why}")
        log.warning("agent updates run eagerly, without CUDA graphs: %s", why)
        self.graphs = None
        self._signatures.clear()
