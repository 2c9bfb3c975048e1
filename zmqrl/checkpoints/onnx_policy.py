"""A policy exported by ``zmqrl export``, played with onnxruntime: no torch in the process.

Why a module of its own, apart from the exporter (:mod:`zmqrl.checkpoints.onnx_export`): a
deployed model runs where torch is not installed, or not wanted (seconds of import, hundreds of
MB), so everything that reads and runs an exported file imports only numpy, onnxruntime and the
config parser. The metadata format is :mod:`zmqrl.checkpoints.onnx_metadata`'s.

An ONNX file is data from wherever it came from, as a checkpoint is (:mod:`zmqrl.code_trust`):
onnxruntime runs its graph's standard operators and imports nothing, every metadata value is
checked before use (``onnx_metadata.read_metadata``), and the env section it carries is
parsed behind the same gate as a checkpoint's stored config (an ``env.id`` that names a module is
refused unless the caller gives it or passes ``--trust-config``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from zmqrl.agents.appo_policy import CoreActing, CoreState
from zmqrl.checkpoints.onnx_inputs import CORE_INPUTS, INPUT, inputs_problem, key_feeds
from zmqrl.checkpoints.onnx_metadata import OnnxMetadata, OnnxModelError, read_metadata
from zmqrl.config import Config
from zmqrl.types import record_dtype

# The extra that brings onnx (export) and onnxruntime (playing), and the line that says so.
INSTALL = "pip install 'zmqrl[onnx]'"


class OnnxUnavailable(RuntimeError):
    """onnx or onnxruntime (the ``onnx`` extra) is not installed; the message is the one-line hint."""


def require(module: str, command: str) -> None:
    """Raise :class:`OnnxUnavailable` with the install hint when ``module`` cannot be imported."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise OnnxUnavailable(f"{command} needs {module}, which is not installed: {INSTALL}")


class OnnxPolicy(CoreActing):
    """Acts greedily with an exported model through onnxruntime, as ``DeployedPolicy`` does with
    a checkpoint: ``act(obs)`` for one observation or a batch ``(B, *obs_shape)``; a Dict
    observation's model takes the env's Dict (one or a batch) or records.

    A recurrent policy's model (``metadata.core``) keeps its LSTM state here as the checkpoint's
    policy does (``zmqrl.core.RecurrentPolicy``): one row per env, in the same order at every call,
    fed to the graph and replaced by what it returns; :meth:`reset` (or ``reset_core(done)`` for
    some rows) starts episodes over from a zero state."""

    def __init__(self, path: str | Path, threads: int = 1) -> None:
        """``threads``: onnxruntime's intra-op threads. One by default: the networks are small,
        and a policy usually runs beside its env (and other processes) on a few cores."""
        require("onnxruntime", "playing an ONNX policy")
        import onnxruntime as ort

        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path}: no such ONNX file")
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        try:
            self._session = ort.InferenceSession(str(self.path), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime's own types (InvalidProtobuf, Fail, ...)
            reason = " ".join(str(exc).split())[:300]
            raise OnnxModelError(f"{self.path}: not a readable ONNX model ({reason})") from None
        props = dict(self._session.get_modelmeta().custom_metadata_map)
        self.metadata = read_metadata(props, str(self.path))
        outputs, expected = [o.name for o in self._session.get_outputs()], self.metadata.outputs()
        if outputs != expected:
            raise OnnxModelError(f"{self.path}: expected the outputs {expected}, got {outputs}")
        problem = inputs_problem(self._session.get_inputs(), self.metadata.inputs())
        if problem is not None:
            raise OnnxModelError(f"{self.path}: {problem}")
        self.obs_shape = self.metadata.obs_shape
        keys = self.metadata.obs_keys
        self.obs_dtype = record_dtype(keys) if keys else np.dtype(self.metadata.obs_dtype)
        self._core = CoreState(self.metadata.core) if self.metadata.core else None

    def reset(self) -> None:
        """Start new episodes: a recurrent policy's state back to zero (nothing for the others).
        Call it after every ``env.reset()``, as ``DeployedPolicy.reset``."""
        self.reset_core()

    def act(self, obs: Any, explore: bool = False) -> np.ndarray:
        """The greedy action for one observation, or actions ``(B, ...)`` for a batch. An export
        holds only the greedy rule: ``explore=True`` is refused rather than silently ignored."""
        if explore:
            raise ValueError("an exported policy acts greedily only (explore=False)")
        if self.metadata.obs_keys:
            feeds, single = key_feeds(obs, self.metadata.obs_keys, self.path)
        else:
            arr = np.ascontiguousarray(obs, dtype=self.obs_dtype)
            single = arr.shape == self.obs_shape
            if not single and arr.shape[1:] != self.obs_shape:
                raise ValueError(
                    f"{self.path}: observations of shape {self.obs_shape} (or a batch of them), "
                    f"got {arr.shape}"
                )
            feeds = {INPUT: arr[None] if single else arr}
        state = None if self._core is None else self._core.rows(len(next(iter(feeds.values()))))
        if state is not None:  # a recurrent policy: each row's state goes in beside its observation
            feeds.update({name: np.ascontiguousarray(state[:, i]) for i, name in enumerate(CORE_INPUTS)})
        actions, *after = self._session.run(self.metadata.outputs(), feeds)
        if state is not None:
            state[:, 0], state[:, 1] = after  # the state the next call continues from
        return np.asarray(actions[0] if single else actions)

    def load_weights(self, arrays: Mapping[str, np.ndarray]) -> None:
        """An export's weights are constants of its graph: export the new checkpoint instead."""
        raise ValueError("an exported ONNX policy's weights are fixed; export the checkpoint again")


def onnx_config(
    metadata: OnnxMetadata,
    source: str,
    config: str | Path | None = None,
    overrides: list[str] | None = None,
    trust_config: bool = False,
) -> Config:
    """The config whose env section the exported policy plays in: the caller's file when given,
    else the env section stored in the model (untrusted data, as a checkpoint's stored config:
    see :func:`zmqrl.checkpoints.policy.checkpoint_config`), ``overrides`` applied last."""
    from zmqrl.config import config_from_dict, load_config

    if config is not None:
        return load_config(config, overrides)
    stored = {"env": metadata.env}
    return config_from_dict(stored, f"{source} (stored env)", overrides, trusted=trust_config)
