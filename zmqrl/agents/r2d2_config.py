"""The recurrent replay agent's hyper-parameters (R2D2, Kapturowski et al. 2019): torch-free, so
parsing a config stays fast, as for the built-in agents' configs in ``zmqrl.agents.configs``."""

from __future__ import annotations

from dataclasses import dataclass, field

from zmqrl.agents.configs import TORSOS, AgentConfigBase, check_adam_schedule
from zmqrl.spec import MAX_CORE_SIZE

# The paper's priority mix: eta * max |td| + (1 - eta) * mean |td| over a sequence's learned steps.
R2D2_PRIORITY_ETA = 0.9


@dataclass
class R2D2Config(AgentConfigBase):
    """Hyperparameters of recurrent DQN on sequences (R2D2); the defaults are sized for small
    partially observed tasks such as CartPole without velocities (configs/cartpole_novel_r2d2.yaml).

    Actors cut each episode into windows of ``burn_in + sequence_length`` steps, one starting every
    ``sequence_length`` steps (the first at step ``-burn_in``, padded), so consecutive windows
    overlap by ``burn_in`` steps and each step is learned in one window (``zmqrl.types.SequenceBatch``).
    ``batch_size`` and ``replay.capacity`` count windows; ``learner.min_replay_size`` counts env
    steps, as for every agent, and ``learner.samples_per_insert`` is windows drawn per env step.
    """

    kind: str = "r2d2"  # agent family, used to pick the agent class from a config file
    # A CNN's features go to the LSTM as they are (hidden_sizes unused), as DQN's and APPO's heads
    # read them; on a Dict observation it encodes the image keys and hidden_sizes mixes every key.
    torso: str = "mlp"  # "mlp" (hidden_sizes), "nature_cnn" (Atari (4, 84, 84)) or "minatar_cnn" (C, 10, 10)
    hidden_sizes: list[int] = field(default_factory=lambda: [64])  # ReLU MLP torso before the LSTM
    core_size: int = 64  # units of the LSTM core between torso and Q head, at most 8192
    sequence_length: int = 20  # learned steps per window (and the windows' period)
    burn_in: int = 10  # steps before them that only warm the core, without gradient (the overlap)
    gamma: float = 0.99  # per-step discount of the n-step targets
    n_step: int = 3  # n-step return horizon inside a window (shorter at its end)
    double: bool = True  # the online net picks the bootstrap action, the target net values it
    priority_eta: float = R2D2_PRIORITY_ETA  # sequence priority: eta * max|td| + (1 - eta) * mean|td|
    lr: float = 1e-3  # Adam learning rate
    lr_final: float | None = None  # anneal lr linearly to this over lr_decay_updates (None: constant)
    lr_decay_updates: int = 0  # updates over which lr moves from `lr` to `lr_final`
    adam_eps: float = 1e-4  # Adam epsilon
    batch_size: int = 32  # sequences per gradient step (the learner samples this many)
    huber_delta: float = 1.0  # TD error beyond which the loss grows linearly instead of quadratically
    max_grad_norm: float = 10.0  # clip the global gradient norm to this; <= 0 disables clipping
    target_update_interval: int = 200  # gradient steps between hard target network copies
    device: str = "auto"  # "auto" (cuda if available), "cpu" or "cuda"

    @property
    def window(self) -> int:
        """Positions of a window: burn-in and learned steps."""
        return self.burn_in + self.sequence_length

    def check(self) -> None:
        """Raise ``ValueError("agent.<field>: ...")`` for the first invalid value."""
        if self.kind != "r2d2":
            raise ValueError(f"agent.kind: expected 'r2d2', got {self.kind!r}")
        super().check()
        if self.torso not in TORSOS:
            raise ValueError(f"agent.torso: must be one of {', '.join(TORSOS)}, got {self.torso!r}")
        sizes = self.hidden_sizes
        if not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in sizes):
            raise ValueError(f"agent.hidden_sizes: every size must be a positive int, got {sizes!r}")
        for name in ("core_size", "sequence_length"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"agent.{name}: must be a positive int, got {value!r}")
        if self.core_size > MAX_CORE_SIZE:
            raise ValueError(f"agent.core_size: must be at most {MAX_CORE_SIZE}, got {self.core_size}")
        if isinstance(self.burn_in, bool) or not isinstance(self.burn_in, int) or self.burn_in < 0:
            raise ValueError(f"agent.burn_in: must be an int >= 0, got {self.burn_in!r}")
        if not 0.0 <= self.priority_eta <= 1.0:
            raise ValueError(f"agent.priority_eta: must be in [0, 1], got {self.priority_eta}")
        check_adam_schedule(self.lr, self.lr_final, self.lr_decay_updates, self.adam_eps)
        if not self.huber_delta > 0.0:
            raise ValueError(f"agent.huber_delta: must be > 0, got {self.huber_delta}")
        if self.target_update_interval < 1:
            raise ValueError(f"agent.target_update_interval: must be >= 1, got {self.target_update_interval}")
