"""``zmqrl export``: a checkpoint's greedy policy as one ONNX file, for serving without zmqrl or torch.

The graph is exactly the rule ``zmqrl eval`` and ``load_policy`` act by (what ``act(obs,
explore=False)`` computes), so a deployment plays what was evaluated:

* DQN: ``argmax_a Q(obs, a)`` of the online network (MLP, Nature CNN or MinAtar CNN torso, plain or
  dueling heads);
* SAC: ``tanh(mean)`` of the policy, rescaled onto the env's action bounds and clipped to them;
* APPO: the argmax of the logits (Discrete actions), or the Gaussian's mean clipped to the bounds;
* R2D2: ``argmax_a Q`` of the online network's step.

A recurrent policy (APPO with ``agent.core: lstm``, R2D2) is one step of its LSTM: its state ``h``
and ``c`` are inputs after the observation's and outputs after the action, so the caller carries
them from step to step (zeros at an episode's start) as ``load_policy`` carries them inside.

Observations enter in the env's own dtype (uint8 frames stay bytes; the cast and the pixel scale
are in the graph), any batch size. A Dict observation enters as one input per key (its name, dtype
and shape), which the agent's own network reads as it reads the keys out of records' bytes
(:class:`~zmqrl.agents.keyed_nets.KeyTensors`: one definition of the network, traced as it is).
The run's spaces, env section and fingerprint travel in the model's metadata
(:mod:`zmqrl.checkpoints.onnx_policy`, which reads and plays it without torch).

torch traces the agent's own modules (the legacy TorchScript exporter: the dynamo one needs
onnxscript, which the extra does not bring); onnx then adds the metadata and checks the model.
"""

from __future__ import annotations

import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch
from torch import nn

from zmqrl.agents.appo_nets import APPOPolicyNet
from zmqrl.agents.appo_policy import APPOActions
from zmqrl.agents.keyed_nets import KeyTensors
from zmqrl.agents.numpy_policies import squashed_action_bounds
from zmqrl.agents.r2d2 import R2D2Net
from zmqrl.checkpoints.files import atomic_write, checkpoint_weights_version, load_checkpoint
from zmqrl.checkpoints.onnx_metadata import RESERVED_NAMES, OnnxMetadata, action_spec
from zmqrl.checkpoints.onnx_policy import require
from zmqrl.checkpoints.policy import (
    checkpoint_config,
    checkpoint_path,
    load_checkpoint_weights,
    make_eval_agent,
)
from zmqrl.config import Config
from zmqrl.core import RecurrentPolicy, is_recurrent
from zmqrl.spec import SampleSpec
from zmqrl.types import ObsEntry

# ONNX operator set of the graph: onnxruntime >= 1.14 runs it, and every op used here has been in
# it for years (Gemm, Conv, ArgMax, Tanh, Min/Max).
OPSET = 17
# The batch of the example input torch traces with: not 1, so that no size is taken for a constant.
TRACE_BATCH = 2
# The agents an export knows the greedy rule of; a plugin agent's rule is its own code.
EXPORTABLE = ("dqn", "sac", "appo", "r2d2")


class OnnxExportError(ValueError):
    """The checkpoint's agent has no greedy rule the exporter knows (a plugin agent)."""


@dataclass(frozen=True)
class Exported:
    """What ``export_onnx`` wrote."""

    path: Path
    metadata: OnnxMetadata
    size: int  # bytes


class GreedyQ(nn.Module):
    """DQN: the action of the largest Q-value (the first one of a tie, as numpy's argmax)."""

    def __init__(self, q_network: nn.Module) -> None:
        super().__init__()
        self.q_network = q_network

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q_network(obs).argmax(dim=1)


class BoundedActions(nn.Module):
    """``min(max(scale * f(out) + shift, low), high)`` of a policy's first output: SAC's squashed
    mean (``f = tanh``, scale and shift map [-1, 1] onto the bounds), APPO's clipped mean (``f``
    the identity, scale 1, shift 0, bounds +-inf where the env has none), or APPO's logits'
    argmax (``discrete``)."""

    low: torch.Tensor  # buffers (register_buffer), float32 (act_dim,) or scalars
    high: torch.Tensor
    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(
        self, policy: nn.Module, low: np.ndarray, high: np.ndarray, squash: bool, discrete: bool = False
    ) -> None:
        super().__init__()
        self.policy, self.squash, self.discrete = policy, squash, discrete
        scale, shift = ((high - low) / 2.0, (high + low) / 2.0) if squash else (1.0, 0.0)
        for name, value in (("low", low), ("high", high), ("scale", scale), ("shift", shift)):
            self.register_buffer(name, torch.as_tensor(np.asarray(value, np.float32)))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.choose(self.policy(obs)[0])

    def choose(self, out: torch.Tensor) -> torch.Tensor:
        """The action of the policy's first output (logits, or the mean)."""
        if self.discrete:
            return out.argmax(dim=1)
        if self.squash:
            out = torch.tanh(out) * self.scale + self.shift
        return torch.minimum(torch.maximum(out, self.low), self.high)


State = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


class RecurrentBounded(nn.Module):
    """APPO with an LSTM core: ``(obs, h, c) -> (action, h', c')``, the heads on the new ``h`` (the
    row's own legal actions for a masked policy), the action chosen as :class:`BoundedActions` does."""

    def __init__(self, bounded: BoundedActions) -> None:
        super().__init__()
        self.bounded = bounded

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> State:
        policy = cast(APPOPolicyNet, self.bounded.policy)
        h, c = policy.cell(policy.features(obs), (h, c))
        return self.bounded.choose(policy.masked_outputs(h, obs)[0]), h, c


class RecurrentGreedyQ(nn.Module):
    """R2D2: ``(obs, h, c) -> (argmax_a Q, h', c')`` of the online network's step."""

    def __init__(self, net: R2D2Net) -> None:
        super().__init__()
        self.net = net

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor) -> State:
        q, (h, c) = self.net.step(obs, (h, c))
        return q.argmax(dim=1), h, c


class KeyedInputs(nn.Module):
    """A Dict observation's graph: one input per key, in key order, handed to ``greedy`` as
    :class:`KeyTensors`, which the keyed networks read where they read records' bytes (a
    recurrent policy's state follows the keys, and is handed on as it is)."""

    def __init__(self, greedy: nn.Module, keys: tuple[str, ...]) -> None:
        super().__init__()
        self.greedy, self.keys = greedy, keys

    def forward(self, *values: torch.Tensor) -> Any:
        count = len(self.keys)
        return self.greedy(KeyTensors(dict(zip(self.keys, values[:count], strict=True))), *values[count:])


def greedy_module(agent: Any, kind: str, spec: SampleSpec) -> nn.Module:
    """The greedy rule of a built-in agent of ``kind`` as one torch module over its own (loaded)
    networks, with the bounds its ``act`` applies (taken from the same functions it takes them from)."""
    if kind == "dqn":
        return GreedyQ(agent.online)
    if kind == "r2d2":
        return RecurrentGreedyQ(agent.online)
    if kind == "sac":
        low, high = squashed_action_bounds(spec)
        return BoundedActions(agent.policy, low, high, squash=True)
    if kind == "appo":
        actions = APPOActions(spec)
        bounded = BoundedActions(
            agent.policy, actions.low, actions.high, squash=False, discrete=actions.discrete
        )
        return RecurrentBounded(bounded) if is_recurrent(agent) else bounded
    raise OnnxExportError(not_exportable(kind))


def core_width(agent: object) -> int:
    """A recurrent agent's LSTM width (its state is ``(B, 2, width)``), 0 for the others."""
    return int(agent.core_state().shape[2]) if isinstance(agent, RecurrentPolicy) and agent.recurrent else 0


def not_exportable(kind: str) -> str:
    return f"agent.kind {kind!r}: zmqrl export knows the greedy rule of {', '.join(EXPORTABLE)} only"


def export_onnx(
    checkpoint: str | Path,
    output: str | Path,
    *,
    config: Config | str | Path | None = None,
    overrides: list[str] | None = None,
    trust_config: bool = False,
) -> Exported:
    """Write the greedy policy of ``checkpoint`` (a checkpoint file, or a run directory: its
    ``latest``) to ``output`` as ONNX. The env and agent are rebuilt as ``zmqrl eval`` rebuilds
    them (the stored config, or ``config``; a stored ``module:...`` needs ``trust_config``)."""
    require("onnx", "zmqrl export")
    import onnx

    from zmqrl.envs.factory import make_env, sample_spec
    from zmqrl.runtime.run_fingerprint import run_fingerprint

    path = checkpoint_path(checkpoint)
    payload = load_checkpoint(path)
    cfg = checkpoint_config(payload, path, config, overrides, trust_config)
    kind = payload.get("agent_kind", cfg.agent.kind)
    if kind != cfg.agent.kind:
        raise ValueError(f"{path}: weights of a '{kind}' agent, but the config asks for '{cfg.agent.kind}'")
    if cfg.agent.kind not in EXPORTABLE:
        raise OnnxExportError(not_exportable(cfg.agent.kind))
    env = make_env(cfg.env, training=False)
    try:
        spec = sample_spec(env)
        agent = make_eval_agent(cfg, env)
    finally:
        env.close()
    for entry in spec.obs_entries:
        if entry.key in RESERVED_NAMES:
            raise OnnxExportError(
                f"Dict observation key {entry.key!r}: the graph's inputs are named by the keys, and "
                f"{entry.key!r} names its output or a recurrent policy's state; rename the key in the env"
            )
    load_checkpoint_weights(agent, payload, path)
    metadata = OnnxMetadata(
        agent=cfg.agent.kind,
        obs_shape=tuple(spec.obs_shape),
        obs_dtype=spec.obs_dtype,
        action=action_spec(spec),
        env=cfg.to_dict()["env"],
        fingerprint=dict(run_fingerprint(cfg, spec)),
        weights_version=checkpoint_weights_version(payload),
        checkpoint=path.name,
        obs_keys=tuple(ObsEntry(e.key, e.shape, e.dtype) for e in spec.obs_entries),
        core=core_width(agent),
    )
    model = onnx.load_from_string(trace(greedy_module(agent, cfg.agent.kind, spec), metadata))
    inputs = ", ".join(name for name, _, _ in metadata.inputs())
    model.doc_string = (
        f"zmqrl {cfg.agent.kind} greedy policy of {path.name} for {cfg.env.id}: "
        f"{inputs} -> {', '.join(metadata.outputs())} (docs/export.md)"
    )
    onnx.helper.set_model_props(model, metadata.to_props())
    onnx.checker.check_model(model, full_check=True)
    data = model.SerializeToString()
    out = Path(output)

    def write(file: IO[bytes]) -> None:
        file.write(data)

    atomic_write(out, write)
    return Exported(out, metadata, len(data))


def trace(module: nn.Module, metadata: OnnxMetadata) -> bytes:
    """``module`` traced on an example batch of the observations ``metadata`` describes (one
    input, or one per key: then ``module`` takes :class:`KeyTensors`; a recurrent policy's state
    after them), as ONNX bytes with a dynamic batch dimension."""
    inputs = metadata.inputs()
    names = [name for name, _, _ in inputs]
    outputs = metadata.outputs()
    if metadata.obs_keys:
        module = KeyedInputs(module, tuple(entry.key for entry in metadata.obs_keys))
    examples = tuple(
        torch.zeros((TRACE_BATCH, *shape), dtype=getattr(torch, dtype)) for _, dtype, shape in inputs
    )
    with tempfile.TemporaryDirectory(prefix="zmqrl-export-") as folder, warnings.catch_warnings():
        # The legacy exporter's deprecation notice, and tracer notes about the shape checks in
        # forward (Python comparisons of sizes, true for every batch): nothing the user can act on.
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module.eval(),
            examples,
            Path(folder) / "traced.onnx",
            dynamo=False,
            input_names=names,
            output_names=outputs,
            dynamic_axes={name: {0: "batch"} for name in [*names, *outputs]},
            opset_version=OPSET,
        )
        return (Path(folder) / "traced.onnx").read_bytes()
