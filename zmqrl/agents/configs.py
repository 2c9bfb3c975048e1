"""Agent hyper-parameters: the fields every agent shares, and one dataclass per built-in algorithm.

Kept free of torch so that parsing a config (the supervisor, `zmqrl config`, `--help`) starts in
a fraction of a second; the algorithm modules import their config from here. An agent from a
plugin brings its own config class, ideally a subclass of :class:`AgentConfigBase`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from zmqrl.spec import MAX_CORE_SIZE

# Values accepted by every agent's `device` field ("auto": cuda when available, else cpu).
DEVICE_NAMES = ("auto", "cpu", "cuda")
# Values of DQNConfig.torso and APPOConfig.torso: the layers between observation and heads (the
# CNNs' tables are in zmqrl.agents.torsos).
TORSOS = ("mlp", "nature_cnn", "minatar_cnn")
# Values of the built-in agents' `capture` field: whether an update runs as one CUDA graph
# (zmqrl.agents.capture). "auto": on a CUDA device, where it removes the per-op dispatch from the
# host (a failed capture is logged and the run goes on eagerly); eager on a CPU, where there is no
# graph to replay. "always": the same, but a failed capture ends the run, and a CPU runs the graph's
# code without a graph (what the tests compare with eager). "never": eager everywhere. (Not on/off:
# YAML reads those as booleans.)
CAPTURE_MODES = ("auto", "always", "never")

# The fields the roles read from every agent's config, whatever its kind: the actors' n-step
# processor (gamma, n_step), the learner's sampling (batch_size) and device, and the kind itself.
BASE_FIELDS = ("kind", "gamma", "n_step", "batch_size", "device")


def check_adam_schedule(lr: float, lr_final: float | None, decay_updates: int, adam_eps: float) -> None:
    """The checks of an Adam step size annealed from ``agent.lr`` to ``agent.lr_final`` (DQN, APPO)."""
    if not lr > 0.0:
        raise ValueError(f"agent.lr: must be > 0, got {lr}")
    if lr_final is not None and not lr_final >= 0.0:
        raise ValueError(f"agent.lr_final: must be >= 0 or null, got {lr_final}")
    if decay_updates < 0:
        raise ValueError(f"agent.lr_decay_updates: must be >= 0, got {decay_updates}")
    if lr_final is not None and decay_updates == 0:
        raise ValueError("agent.lr_decay_updates: must be > 0 when agent.lr_final is set")
    if not adam_eps > 0.0:
        raise ValueError(f"agent.adam_eps: must be > 0, got {adam_eps}")


def check_capture(capture: str) -> None:
    """The check of a built-in agent's ``capture`` field."""
    if capture not in CAPTURE_MODES:
        raise ValueError(f"agent.capture: must be one of {', '.join(CAPTURE_MODES)}, got {capture!r}")


@dataclass
class AgentConfigBase:
    """What every agent's config provides, because the roles read it (see ``BASE_FIELDS``).

    Plugins subclass it and add their own hyperparameters (each with a default, so that
    ``agent: {kind: ...}`` alone is a working config); a subclass re-declares a field to change
    its default, and must re-declare ``kind`` with its plugin's name as the default. ``check``
    validates these fields; a subclass extends it with ``super().check()``.
    """

    kind: str = ""  # which agent: a registered name (dqn, sac, a plugin's) or "module:ATTRIBUTE"
    gamma: float = 0.99  # per-step discount; used by the actors' n-step processor
    n_step: int = 1  # length of the n-step return window (actors' n-step processor)
    batch_size: int = 128  # transitions per gradient step (the learner samples this many)
    device: str = "auto"  # "auto" (cuda if available), "cpu" or "cuda"

    def check(self) -> None:
        """Raise ``ValueError("agent.<field>: ...")`` for the first invalid shared value."""
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"agent.gamma: must be in (0, 1], got {self.gamma}")
        if self.n_step < 1:
            raise ValueError(f"agent.n_step: must be >= 1, got {self.n_step}")
        if self.batch_size < 1:
            raise ValueError(f"agent.batch_size: must be >= 1, got {self.batch_size}")
        if self.device not in DEVICE_NAMES:
            raise ValueError(f"agent.device: must be one of {', '.join(DEVICE_NAMES)}, got {self.device!r}")


@dataclass
class DQNConfig(AgentConfigBase):
    """Hyperparameters of the DQN agent; the defaults learn CartPole-v1."""

    kind: str = "dqn"  # agent family, used to pick the agent class from a config file
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])  # MLP hidden layer widths
    dueling: bool = False  # split the head into V(s) + A(s, a) - mean A
    double: bool = True  # pick next actions with the online net, evaluate them with the target net
    gamma: float = 0.99  # per-step discount; used by the actors' n-step processor, not by update()
    n_step: int = 3  # length of the n-step return window (actors' n-step processor)
    lr: float = 5e-4  # Adam learning rate
    lr_final: float | None = None  # anneal lr linearly to this over lr_decay_updates (None: constant)
    lr_decay_updates: int = 0  # updates over which lr moves from `lr` to `lr_final`
    adam_eps: float = 1.5e-4  # Adam epsilon; larger than torch's 1e-8 to damp steps on tiny gradients
    batch_size: int = 128  # transitions per gradient step (the learner samples this many)
    huber_delta: float = 1.0  # TD error beyond which the loss grows linearly instead of quadratically
    max_grad_norm: float = 10.0  # clip the global gradient norm to this; <= 0 disables clipping
    target_update_interval: int = 250  # gradient steps between target network updates
    tau: float = 1.0  # target update weight: 1.0 = hard copy each interval; e.g. 0.005 with interval 1
    device: str = "auto"  # "auto" (cuda if available), "cpu" or "cuda"
    capture: str = "auto"  # run each update as one CUDA graph: "auto" (CUDA only), "always", "never"
    torso: str = "mlp"  # "mlp" (hidden_sizes), "nature_cnn" (Atari (4, 84, 84)) or "minatar_cnn" (C, 10, 10)

    def check(self) -> None:
        """Raise ``ValueError("agent.<field>: ...")`` for the first invalid value.

        An explicit method rather than ``__post_init__`` so that a config can be built, edited
        (e.g. CLI overrides) and validated once, when complete.
        """
        if self.kind != "dqn":
            raise ValueError(f"agent.kind: expected 'dqn', got {self.kind!r}")
        sizes = self.hidden_sizes
        if not all(isinstance(size, int) and not isinstance(size, bool) and size > 0 for size in sizes):
            raise ValueError(f"agent.hidden_sizes: every size must be a positive int, got {sizes!r}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"agent.gamma: must be in (0, 1], got {self.gamma}")
        if self.n_step < 1:
            raise ValueError(f"agent.n_step: must be >= 1, got {self.n_step}")
        check_adam_schedule(self.lr, self.lr_final, self.lr_decay_updates, self.adam_eps)
        if self.batch_size < 1:
            raise ValueError(f"agent.batch_size: must be >= 1, got {self.batch_size}")
        if not self.huber_delta > 0.0:
            raise ValueError(f"agent.huber_delta: must be > 0, got {self.huber_delta}")
        if self.target_update_interval < 1:
            raise ValueError(f"agent.target_update_interval: must be >= 1, got {self.target_update_interval}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"agent.tau: must be in (0, 1], got {self.tau}")
        if self.device not in DEVICE_NAMES:
            raise ValueError(f"agent.device: must be one of {', '.join(DEVICE_NAMES)}, got {self.device!r}")
        if self.torso not in TORSOS:
            raise ValueError(f"agent.torso: must be one of {', '.join(TORSOS)}, got {self.torso!r}")
        check_capture(self.capture)


@dataclass
class SACConfig(AgentConfigBase):
    """Hyperparameters of soft actor-critic (Haarnoja et al., 2018, with automatic entropy tuning).

    Actors get only the policy's weights; the learner keeps the twin critics and their targets.
    """

    kind: str = "sac"  # agent family, used to pick the agent class from a config file
    hidden_sizes: list[int] = field(default_factory=lambda: [256, 256])  # MLP widths (policy and critics)
    gamma: float = 0.99  # per-step discount; used by the actors' n-step processor
    n_step: int = 1  # length of the n-step return window (actors' n-step processor)
    actor_lr: float = 3e-4  # Adam learning rate of the policy
    critic_lr: float = 3e-4  # Adam learning rate of the twin critics
    alpha_lr: float = 3e-4  # Adam learning rate of log(alpha) when autotune is on
    alpha: float = 1.0  # entropy weight: the starting value when autotune is on, else fixed
    autotune: bool = True  # adjust alpha so the policy's entropy tracks target_entropy
    target_entropy: float | None = None  # None: -(action dimensions), the usual choice
    batch_size: int = 256  # transitions per gradient step (the learner samples this many)
    tau: float = 0.005  # Polyak weight of the critic targets, applied every target_update_interval
    target_update_interval: int = 1  # gradient steps between critic target updates
    policy_update_interval: int = 1  # critic steps per policy (and alpha) step
    max_grad_norm: float = 0.0  # clip each network's gradient norm to this; <= 0 disables clipping
    device: str = "auto"  # "auto" (cuda if available), "cpu" or "cuda"
    capture: str = "auto"  # run each update as one CUDA graph: "auto" (CUDA only), "always", "never"
    noise_beta: float = 0.0  # acting noise PSD ~ 1/f**beta: 0 white, 1 pink (sparse rewards), 2 red
    noise_horizon: int = 1000  # colored noise length, ~ an episode: 1/horizon is its slowest frequency

    def check(self) -> None:
        """Raise ``ValueError("agent.<field>: ...")`` for the first invalid value."""
        if self.kind != "sac":
            raise ValueError(f"agent.kind: expected 'sac', got {self.kind!r}")
        sizes = self.hidden_sizes
        if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            raise ValueError(f"agent.hidden_sizes: every size must be a positive int, got {sizes!r}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"agent.gamma: must be in (0, 1], got {self.gamma}")
        if self.n_step < 1:
            raise ValueError(f"agent.n_step: must be >= 1, got {self.n_step}")
        for name in ("actor_lr", "critic_lr", "alpha_lr", "alpha"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"agent.{name}: must be > 0, got {getattr(self, name)}")
        if self.batch_size < 1:
            raise ValueError(f"agent.batch_size: must be >= 1, got {self.batch_size}")
        if not 0.0 < self.tau <= 1.0:
            raise ValueError(f"agent.tau: must be in (0, 1], got {self.tau}")
        for name in ("target_update_interval", "policy_update_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name}: must be >= 1, got {getattr(self, name)}")
        if self.device not in DEVICE_NAMES:
            raise ValueError(f"agent.device: must be one of {', '.join(DEVICE_NAMES)}, got {self.device!r}")
        if not 0.0 <= self.noise_beta <= 2.0:
            raise ValueError(
                f"agent.noise_beta: must be in [0, 2] (0 white, 1 pink, 2 red), got {self.noise_beta}; "
                "use 1 for sparse-reward tasks, 0 for the usual white noise"
            )
        check_capture(self.capture)
        if self.noise_horizon < 2:
            raise ValueError(
                f"agent.noise_horizon: must be >= 2 steps, got {self.noise_horizon}; "
                "set it near the episode length (e.g. 1000)"
            )


# Values of APPOConfig.core: what sits between the torso and the heads ("none": the heads read the
# torso; "lstm": an LSTM cell of core_size units, its state carried along each env's episode).
CORES = ("none", "lstm")
# Values of APPOConfig.log_std: how the Gaussian policy of continuous actions gets its spread.
LOG_STD_MODES = ("param", "state")


@dataclass
class APPOConfig(AgentConfigBase):
    """Hyperparameters of asynchronous PPO on V-trace targets (IMPALA with ``clip: null``).

    Actors act with the policy network only and send rollouts of ``actor.rollout_length`` steps
    with their log-probabilities; the learner trains the policy and a separate value network on
    batches of them, correcting the actors' lag with V-trace (Espeholt et al., 2018) and, with
    ``clip`` set, PPO's clipped surrogate on V-trace advantages (Schulman et al., 2017).
    """

    kind: str = "appo"  # agent family, used to pick the agent class from a config file
    hidden_sizes: list[int] = field(default_factory=lambda: [64, 64])  # MLP widths (policy and value nets)
    torso: str = "mlp"  # "mlp" (hidden_sizes), "nature_cnn" (Atari (4, 84, 84)) or "minatar_cnn" (C, 10, 10)
    gamma: float = 0.99  # per-step discount of the V-trace targets
    n_step: int = 1  # unused by on-policy agents (rollouts carry single steps); must stay 1
    batch_size: int = 1024  # env steps per update: a multiple of actor.rollout_length (rollouts x T)
    lr: float = 3e-4  # Adam learning rate (policy and value nets)
    lr_final: float | None = None  # anneal lr linearly to this over lr_decay_updates (None: constant)
    lr_decay_updates: int = 0  # updates over which lr moves from `lr` to `lr_final`
    adam_eps: float = 1e-5  # Adam epsilon
    clip: float | None = 0.2  # PPO ratio clip range; null: plain IMPALA policy gradient (no clip)
    epochs: int = 1  # passes over each batch (ratios leave 1 from the second pass on)
    minibatches: int = 1  # gradient steps per pass, each on a slice of the batch's rollouts
    vf_coef: float = 0.5  # weight of the value loss (squared error to the V-trace targets)
    ent_coef: float = 0.0  # weight of the entropy bonus
    max_grad_norm: float = 0.5  # clip the global gradient norm to this; <= 0 disables clipping
    rho_bar: float = 1.0  # V-trace: truncation of the importance weights in the value targets
    c_bar: float = 1.0  # V-trace: truncation of the traces (how far corrections propagate back)
    pg_rho_bar: float = 1.0  # V-trace: truncation of the importance weights of the policy advantages
    normalize_advantages: bool = True  # advantages to zero mean, unit variance per minibatch
    log_std: str = "param"  # continuous actions: "param" (state-independent) or "state" (a head)
    log_std_init: float = 0.0  # continuous actions: initial log standard deviation
    device: str = "auto"  # "auto" (cuda if available), "cpu" or "cuda"
    capture: str = "auto"  # run each update as one CUDA graph: "auto" (CUDA only), "always", "never"
    core: str = "none"  # "none", or "lstm": an LSTM cell after the torso (the value net reads its h)
    core_size: int = 64  # units of the LSTM core (agent.core: lstm), at most 8192

    def check(self) -> None:
        """Raise ``ValueError("agent.<field>: ...")`` for the first invalid value."""
        super().check()
        if self.core not in CORES:
            raise ValueError(f"agent.core: must be one of {', '.join(CORES)}, got {self.core!r}")
        size = self.core_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_CORE_SIZE:
            raise ValueError(f"agent.core_size: must be an int from 1 to {MAX_CORE_SIZE}, got {size!r}")
        if self.kind != "appo":
            raise ValueError(f"agent.kind: expected 'appo', got {self.kind!r}")
        sizes = self.hidden_sizes
        if not sizes or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in sizes):
            raise ValueError(f"agent.hidden_sizes: every size must be a positive int, got {sizes!r}")
        if self.n_step != 1:
            raise ValueError(
                f"agent.n_step: must be 1 (on-policy rollouts are single steps), got {self.n_step}"
            )
        check_adam_schedule(self.lr, self.lr_final, self.lr_decay_updates, self.adam_eps)
        if self.clip is not None and not self.clip > 0.0:
            raise ValueError(f"agent.clip: must be > 0, or null for no clipping, got {self.clip}")
        for name in ("epochs", "minibatches"):
            if getattr(self, name) < 1:
                raise ValueError(f"agent.{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("vf_coef", "ent_coef"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"agent.{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("rho_bar", "c_bar", "pg_rho_bar"):
            if not getattr(self, name) > 0.0:
                raise ValueError(f"agent.{name}: must be > 0, got {getattr(self, name)}")
        if self.torso not in TORSOS:
            raise ValueError(f"agent.torso: must be one of {', '.join(TORSOS)}, got {self.torso!r}")
        check_capture(self.capture)
        if self.log_std not in LOG_STD_MODES:
            raise ValueError(
                f"agent.log_std: must be one of {', '.join(LOG_STD_MODES)}, got {self.log_std!r}"
            )
        if not -20.0 <= self.log_std_init <= 2.0:
            raise ValueError(f"agent.log_std_init: must be in [-20, 2], got {self.log_std_init}")


# The type of a config's `agent` section: whichever plugin's config class its `kind` selects.
AgentConfig = AgentConfigBase
