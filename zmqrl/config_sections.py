"""The run config's sections: one dataclass per YAML section, and :class:`Config` that holds them.

Every field has a working default and a one-line comment, so ``Config()`` is a runnable CartPole
DQN setup and the YAML files only say what differs. Plain data: reading, layering and checking
them is :mod:`zmqrl.config` (the entry points, which re-export these classes: import them from
there), :mod:`zmqrl.config_parse` and :mod:`zmqrl.config_checks`, which all import this module and
none of which it imports.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zmqrl.agents.configs import AgentConfigBase, DQNConfig


@dataclass
class RunConfig:
    name: str = "cartpole_dqn"  # run directory is <dir>/<name>/
    dir: str = "runs"  # parent of run directories
    seed: int = 0  # base seed: actor i uses seed + 1000 * (i + 1), eval env seed + 999_999
    log_level: str = "info"  # debug | info | warning | error


@dataclass
class AtariConfig:
    noop_max: int = 30  # up to this many no-op actions after each reset (random start states)
    frame_skip: int = 4  # repeat each action this many frames (the env itself must use frameskip=1)
    screen_size: int = 84  # frames are resized to screen_size x screen_size
    grayscale: bool = True  # one luminance channel instead of RGB
    frame_stack: int = 4  # observations are the last this many frames
    terminal_on_life_loss: bool = False  # training episodes end when a life is lost (eval never)
    clip_rewards: bool = True  # training rewards become their sign (-1, 0, 1); eval sees raw rewards


@dataclass
class EnvConfig:
    id: str = "CartPole-v1"  # gymnasium environment id (e.g. ALE/Pong-v5 with the `atari` extra)
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to gymnasium.make
    max_episode_steps: int | None = None  # override the registered time limit
    preprocess: str = "none"  # "none", or "atari": the standard DeepMind preprocessing (env.atari.*)
    atari: AtariConfig = field(default_factory=AtariConfig)  # used when preprocess is "atari"


@dataclass
class ReplayConfig:
    capacity: int = 100_000  # transitions kept (oldest overwritten)
    prioritized: bool = False  # sample in proportion to priority ** alpha (Schaul et al., 2016)
    alpha: float = 0.6  # how strongly priorities skew sampling (0: uniform)
    beta: float = 0.4  # importance-sampling exponent at the first update, annealed linearly to 1
    beta_updates: int = 100_000  # updates over which beta reaches 1
    priority_eps: float = 1e-6  # added to |TD error| so no transition's priority is ever 0
    share_frames: bool = False  # store each image plane once (stacked Atari frames: ~8x less memory)
    max_initial_priority_ratio: float = 10.0  # actor-sent priorities are clipped to this x the learner's max
    max_priority: float = 1000.0  # cap on any stored priority (|TD error|), actor-sent or the learner's own
    max_draw_ratio: float = 10.0  # no row is stored with a weight above this x the buffer's mean weight


@dataclass
class LearnerConfig:
    max_updates: int = 20_000  # the run ends after this many gradient updates
    max_seconds: float | None = None  # wall-time limit from the learner's start (each restart counts anew)
    min_replay_size: int = 1_000  # transitions in replay before the first update
    sync_interval: int = 50  # publish new weights every this many updates
    republish_seconds: float = 1.0  # re-send the latest weights this often (joiners also get them at once)
    eval_interval: int = 1_000  # evaluate greedily every this many updates (0 = only at the end)
    eval_episodes: int = 10  # episodes per evaluation (played in lockstep, batched)
    target_return: float | None = None  # report when the mean eval return first reaches this
    target_hold: int = 3  # ... and when it first stayed there for this many evaluations in a row
    stop_at_target: bool = False  # end the run (finished) once the target is held for target_hold evals
    checkpoint_interval: int = 5_000  # save `latest` every this many updates (and at the end)
    log_interval: int = 100  # updates between TensorBoard scalar writes
    progress_seconds: float = 5.0  # seconds between progress lines in the learner's log
    torch_threads: int = 1  # intra-op threads for the learner's torch on CPU
    samples_per_insert: float | None = None  # replay ratio: transitions sampled per transition received
    samples_per_insert_tolerance: int = 1_000  # transitions either side of the ratio before a side waits
    max_policy_lag: int | None = None  # drop batches acted with weights more than this many versions old
    ingest_max_share: float | None = 0.05  # unused since ingest has a process of its own (old configs load)
    max_nonfinite_updates: int = 100  # updates in a row skipped for a NaN/inf loss or gradient: then exit 1
    queue_steps: int | None = None  # on-policy: rollout steps queued before actors wait (None: 2 batches)


@dataclass
class ActorConfig:
    num_actors: int = 2  # actor processes started by `zmqrl launch`
    send_batch: int = 64  # transitions per samples message
    epsilon: float = 0.4  # Ape-X ladder base: actor i explores with eps ** (1 + alpha * i / (N - 1))
    epsilon_alpha: float = 7.0  # Ape-X ladder exponent
    epsilon_decay_steps: int = 0  # anneal each actor from epsilon 1.0 to its ladder rung over these steps
    max_steps_per_s: float | None = None  # cap each actor's env steps/s (None: as fast as it can)
    weights_poll_steps: int = 32  # env steps between checks for newly published weights
    max_steps: int | None = None  # stop after this many env steps (None: until told to stop)
    envs_per_actor: int = 1  # sub-envs each actor steps together (a gymnasium vector env, batched acting)
    rollout_length: int = 32  # on-policy agents: env steps per rollout (one rollout per sub-env per message)


@dataclass
class TransportConfig:
    samples: str = "tcp://127.0.0.1:5555"  # learner binds PULL here; actors connect PUSH
    weights: str = "tcp://127.0.0.1:5556"  # learner binds XPUB here; actors connect SUB
    heartbeat: str = "tcp://127.0.0.1:5557"  # supervisor binds PULL here; roles connect PUSH
    control: str = "tcp://127.0.0.1:5558"  # supervisor binds PUB here; roles connect SUB
    samples_hwm: int = 64  # queued sample messages per peer before the actor blocks (backpressure)
    samples_buffer_kb: int = 0  # kernel TCP buffer per samples connection in KiB (0: the OS default)
    max_message_mb: int = 64  # a larger incoming samples or weights message (all frames) is dropped unread
    linger_ms: int = 1_000  # how long a closing socket may keep flushing queued messages
    keys_dir: str | None = None  # CurveZMQ keys made by `zmqrl keys DIR` (None: no encryption)
    key_name: str = "client"  # client pair in keys_dir ("client": the role's own pair, e.g. actor, if there)
    insecure: bool = False  # allow binding a non-loopback address without keys (prints a warning)
    connect_timeout: float | None = 300.0  # an actor with no learner connected this long exits 1 (None: no)
    control_token_file: str | None = None  # run secret for heartbeats/control without keys (supervise writes)
    control_keys_dir: str | None = None  # role keys derived from it: ROLE/control.key (the supervisor writes)
    max_abs_reward: float = 1e6  # a reward beyond this per env step makes a samples message bad (dropped)
    max_abs_obs: float = 1e6  # observation limit where the env's space declares no finite bound


@dataclass
class SupervisorConfig:
    heartbeat_interval: float = 0.5  # seconds between heartbeats (each role beats from a thread of its own)
    heartbeat_timeout: float = 3.0  # no heartbeat this long: dead or stopped (killed and replaced)
    progress_timeout: float = 60.0  # a learner's or evaluator's main loop stuck this long: hung (exit 3)
    actor_progress_timeout: float = 6.0  # the same for an actor (its loop turns every few env steps)
    startup_timeout: float = 10.0  # seconds from a process's start to its first heartbeat
    join_timeout: float = 60.0  # a supervised role waits this long for a supervisor it has not heard yet
    max_restarts: int = 5  # a slot failing more often than this within restart_window is given up
    restart_window: float = 3600.0  # ... counting failures since its last healthy run, over this many seconds
    healthy_seconds: float = 300.0  # useful work this long makes a process healthy: backoff and count reset
    restart_backoff: float = 0.5  # delay before a restart, doubled for each failure since a healthy run
    restart_backoff_max: float = 30.0  # the longest delay before a restart
    stop_grace: float = 10.0  # seconds from the stop broadcast to SIGTERM, and again to SIGKILL
    progress_seconds: float = 5.0  # seconds between progress lines on the console
    no_progress_seconds: float = 600.0  # no new best eval for this long, 3+ evals: warn (0: off)
    status: str = "tcp://127.0.0.1:0"  # supervisor answers `zmqrl status` here (port 0: any free port)
    extra_slots: int = 8  # `supervise`: senders tracked beyond the config's roles (more are dropped)
    metrics_http: str | None = "127.0.0.1:9464"  # Prometheus /metrics of the run (port 0: any; None: off)
    health_http: str | None = None  # each role's /healthz, /readyz (port 0: any; None: off)


@dataclass
class EvaluatorConfig:
    enabled: bool = False  # evaluate in a separate `zmqrl evaluator` process (the learner then does not)
    episodes: int = 10  # greedy episodes per evaluation, played in lockstep
    interval_seconds: float = 5.0  # evaluate the newest weights at most this often
    torch_threads: int = 1  # intra-op threads for the evaluator's torch


@dataclass
class CheckpointConfig:
    keep: int = 3  # checkpoints kept (ckpt-<updates>, each with its replay-<updates>.npz); older ones deleted
    replay: bool = True  # save replay with each checkpoint, so a resumed learner does not start empty
    replay_max_mb: int = 1024  # at most this much replay per checkpoint (the newest rows; disk: keep x this)
    force_resume: bool = False  # resume although env, network, n_step or gamma changed (--force)


@dataclass
class LoggingConfig:
    backends: list[str] = field(default_factory=lambda: ["tensorboard"])  # any of tensorboard, wandb, mlflow
    project: str = "zmqrl"  # the W&B project, and the MLflow experiment, runs are logged under
    wandb_mode: str = "online"  # online | offline (a local run directory, uploaded later with `wandb sync`)
    wandb_entity: str | None = None  # W&B team or user (None: the account's default)
    mlflow_tracking_uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else <run dir>/mlruns


@dataclass
class Config:
    run: RunConfig = field(default_factory=RunConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfigBase = field(default_factory=DQNConfig)  # the class of the plugin agent.kind names
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    supervisor: SupervisorConfig = field(default_factory=SupervisorConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    @property
    def run_dir(self) -> Path:
        return Path(self.run.dir) / self.run.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
