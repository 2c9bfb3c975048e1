"""Everything a run reports, in one table: every TensorBoard / metrics.jsonl tag and every
Prometheus metric the supervisor exports, each with its meaning and unit.

Why one table in code: docs/metrics.md's two tables are generated from it (``python
benchmarks/docgen.py``; tests fail when they are stale), tests/test_metrics_tags.py checks every tag a
real run writes against :data:`TAGS`, and the supervisor's Prometheus collector
(zmqrl/supervisor/prometheus.py) exports exactly the rows of :data:`PROMETHEUS`, reading each from
the heartbeat counter its row names. A metric added in one place and not the other cannot pass.

The tables below are data: ``# fmt: off`` keeps each row on its own two or three lines.
"""

from __future__ import annotations

from dataclasses import dataclass

# x-axis of a tag's `step`: env steps (transitions the learner had received) for returns...
ENV_STEPS = "env steps"
# ...and learner updates for everything else.
UPDATES = "updates"

# Prometheus metric types (OpenMetrics' names).
COUNTER, GAUGE, HISTOGRAM = "counter", "gauge", "histogram"
# A metric fed by every role's heartbeats (its `role` label says which).
ANY_ROLE = "any"
# The labels of a heartbeat-fed metric: the slot (role, id) whose process reported it.
SLOT_LABELS = ("role", "id")

# Feeds that are not a heartbeat counter: what the supervisor itself knows of a slot or the run.
FEED_UP = "(up)"
FEED_RESTARTS = "(restarts)"
FEED_HEARTBEAT_AGE = "(heartbeat age)"
FEED_BAD = "(bad messages)"
FEED_RUN = "(run)"
FEED_TEXT = {
    FEED_UP: "the supervisor: 1 while the slot's process heartbeats (within "
    "`supervisor.heartbeat_timeout`), 0 once it is silent, exiting or gone",
    FEED_RESTARTS: "the supervisor's count of the slot's restarts (as in `zmqrl status`)",
    FEED_HEARTBEAT_AGE: "the supervisor's clock, at the scrape",
    FEED_BAD: "heartbeat counters `bad_messages` (reason `message`), `bad_control` (`control`), "
    "`auth_denied` (`auth`); the supervisor's own drops as role `supervisor`: malformed or "
    "unauthenticated heartbeats (`heartbeat`), status requests (`status`)",
    FEED_RUN: "the run's config (`run.name`, `agent.kind`, `env.id`) and the command",
}
# zmqrl_bad_messages_total's `reason` label for each heartbeat counter that counts drops.
BAD_REASONS = {"bad_messages": "message", "bad_control": "control", "auth_denied": "auth"}
# The supervisor's own drops, by reason (reported with role "supervisor", id "0").
SUPERVISOR_BAD_REASONS = ("heartbeat", "status")
# Heartbeat counters deliberately not exported, and why (tests check every counter a run sends is
# either a metric's feed or here).
LEFT_OUT = {
    "work": "the liveness check's useful-work count, which moves with updates, steps, evaluations",
    "target_time": "a milestone, the Unix time the target return was reached: in stats.json",
    "target_samples": "a milestone: in stats.json",
    "target_updates": "a milestone: in stats.json",
    "target_held_time": "a milestone, the Unix time the target return was held: in stats.json",
    "target_held_samples": "a milestone: in stats.json",
    "target_held_updates": "a milestone: in stats.json",
    "launched": "the Unix time the learner's start-up marks count from: in learner-stats.json",
    "queue_capacity_rollouts": "on-policy: the queue's capacity in rollouts; replay_capacity has it in steps",
}
# Buckets of the policy-lag histogram, in weights versions.
LAG_BUCKETS = (0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


@dataclass(frozen=True)
class Tag:
    """A scalar some role writes to TensorBoard and metrics.jsonl."""

    tag: str  # namespaced: charts/, losses/, actor/, learner/, replay/, perf/, supervisor/
    unit: str
    axis: str  # ENV_STEPS or UPDATES: what the row's `step` counts
    meaning: str


@dataclass(frozen=True)
class Metric:
    """A Prometheus metric of the supervisor's /metrics, and where its value comes from."""

    name: str  # full exposed name: counters end in _total, units in the name (_seconds, _bytes)
    kind: str  # COUNTER, GAUGE or HISTOGRAM
    role: str  # whose heartbeats feed it: "learner", "actor", "evaluator", ANY_ROLE, or "supervisor"
    feed: str  # the heartbeat counter read, or one of the FEED_* the supervisor knows itself
    unit: str
    meaning: str
    labels: tuple[str, ...] = SLOT_LABELS
    scale: float = 1.0  # multiplies the counter (MiB to bytes)
    buckets: tuple[float, ...] = ()  # a histogram's upper bounds (+Inf added)

    @property
    def family(self) -> str:
        """The name prometheus_client's metric families take: a counter's without ``_total``."""
        return self.name.removesuffix("_total") if self.kind == COUNTER else self.name


# Every tag a run can write, in the order docs/metrics.md lists them.
# fmt: off
TAGS: tuple[Tag, ...] = (
    Tag("charts/episodic_return", "return", ENV_STEPS,
        "return of a training episode finished by an actor (with exploration)"),
    Tag("charts/episodic_length", "env steps", ENV_STEPS,
        "length of that episode"),
    Tag("charts/eval_return", "return", ENV_STEPS,
        "mean return of greedy evaluation episodes, by the learner's eval envs or (`evaluator.enabled`) "
        "by the evaluator"),
    Tag("charts/eval_return_std", "return", ENV_STEPS,
        "standard deviation of those returns"),
    Tag("charts/eval_weights_version", "version", ENV_STEPS,
        "evaluator: the weights version it scored"),
    Tag("charts/eval_seconds", "s", ENV_STEPS,
        "evaluator: how long that evaluation took"),
    Tag("losses/loss", "loss", UPDATES,
        "DQN: Huber TD loss of the batch (importance-weighted with prioritized replay)"),
    Tag("losses/q_mean", "return", UPDATES,
        "mean Q of the taken actions (SAC: of the two critics)"),
    Tag("losses/target_q_mean", "return", UPDATES,
        "DQN: mean n-step TD target"),
    Tag("losses/td_abs_mean", "return", UPDATES,
        "mean absolute TD error (what prioritized replay's priorities are)"),
    Tag("losses/grad_norm", "norm", UPDATES,
        "DQN, APPO: gradient norm before clipping (`agent.max_grad_norm`; APPO: mean over the update's "
        "minibatch steps)"),
    Tag("losses/critic_loss", "loss", UPDATES,
        "SAC: loss of the two critics"),
    Tag("losses/actor_loss", "loss", UPDATES,
        "SAC: policy loss (NaN, so `null`, on updates without a policy step)"),
    Tag("losses/alpha", "coefficient", UPDATES,
        "SAC: entropy temperature this update used"),
    Tag("losses/alpha_loss", "loss", UPDATES,
        "SAC: temperature loss (0 with `agent.autotune: false`)"),
    Tag("losses/entropy", "nats", UPDATES,
        "SAC: mean policy entropy estimate (−log π); APPO: mean entropy of the policy's distribution over"
        " the batch"),
    Tag("losses/policy_loss", "loss", UPDATES,
        "APPO: clipped surrogate loss on V-trace advantages (IMPALA with `agent.clip: null`: −log π × "
        "advantage), mean over the minibatch steps"),
    Tag("losses/value_loss", "loss", UPDATES,
        "APPO: squared error of the value net to the V-trace targets (times ½), mean over the minibatch "
        "steps"),
    Tag("losses/approx_kl", "nats", UPDATES,
        "APPO: estimate of KL(behaviour ‖ current) over the batch's actions; 0 when every ratio is 1"),
    Tag("losses/clip_fraction", "fraction", UPDATES,
        "APPO: share of actions whose ratio π/μ fell outside 1 ± `agent.clip`"),
    Tag("losses/ratio_mean", "ratio", UPDATES,
        "APPO: mean probability ratio π/μ of the current policy to the one that acted (1 on fresh data, "
        "first pass)"),
    Tag("losses/rho_mean", "ratio", UPDATES,
        "APPO: mean V-trace importance weight, truncated at `agent.rho_bar` (how far off-policy the batch"
        " was)"),
    Tag("losses/advantage_mean", "return", UPDATES,
        "APPO: mean V-trace policy advantage of the batch, before normalisation"),
    Tag("losses/value_mean", "return", UPDATES,
        "APPO: mean value estimate of the batch's observations"),
    Tag("losses/lr", "rate", UPDATES,
        "APPO: learning rate of this update (`agent.lr`, annealed towards `agent.lr_final`)"),
    Tag("losses/skipped_minibatches", "steps", UPDATES,
        "APPO: minibatch steps refused in this update for a non-finite loss or gradient"),
    Tag("learner/policy_lag_min", "versions", UPDATES,
        "published version minus the version a batch was acted with: least since the last log point"),
    Tag("learner/policy_lag_mean", "versions", UPDATES,
        "the same, mean"),
    Tag("learner/policy_lag_max", "versions", UPDATES,
        "the same, most"),
    Tag("learner/stale_batches", "batches", UPDATES,
        "batches dropped for a lag above `learner.max_policy_lag` (total)"),
    Tag("learner/weights_version", "version", UPDATES,
        "latest published weights version"),
    Tag("learner/bad_messages", "messages", UPDATES,
        "sample messages dropped as malformed or unfit: values outside what the run can mean (observation"
        " bounds, `transport.max_abs_reward`, ...), a weights version not yet published (total)"),
    Tag("learner/nonfinite_updates", "updates", UPDATES,
        "updates skipped because their loss or gradients held NaN or infinity: nothing was stepped "
        "(total; `learner.max_nonfinite_updates` in a row end the learner)"),
    Tag("learner/lost_batches", "batches", UPDATES,
        "batches missing by `seq`, summed over actors (per actor in `learner-stats.json`)"),
    Tag("learner/reordered_batches", "batches", UPDATES,
        "batches arrived late by `seq`, summed over actors"),
    Tag("learner/actor_restarts", "restarts", UPDATES,
        "actor restarts seen in the batches' `seq`, summed over actors"),
    Tag("replay/size", "transitions", UPDATES,
        "transitions in the replay buffer (on-policy: env steps of rollouts queued)"),
    Tag("replay/megabytes", "MiB", UPDATES,
        "memory the buffer uses now"),
    Tag("replay/samples_per_insert", "ratio", UPDATES,
        "transitions sampled per transition inserted, since start (the replay ratio)"),
    Tag("replay/queue_rollouts", "rollouts", UPDATES,
        "on-policy: rollouts waiting in the learner's queue"),
    Tag("replay/queue_capacity_rollouts", "rollouts", UPDATES,
        "on-policy: the most rollouts the queue holds before actors wait (`learner.queue_steps`)"),
    Tag("replay/clipped_priorities", "rows", UPDATES,
        "prioritized: priorities stored lowered by a bound: `replay.max_priority`, "
        "`replay.max_draw_ratio` × the mean weight, or (actor-sent) `replay.max_initial_priority_ratio` ×"
        " the max priority (total)"),
    Tag("replay/stale_priority_updates", "rows", UPDATES,
        "prioritized: priority updates skipped because the row was overwritten meanwhile (total)"),
    Tag("replay/max_priority", "priority", UPDATES,
        "prioritized: largest priority the learner measured, at most `replay.max_priority` (what new rows"
        " without one get)"),
    Tag("replay/per_beta", "exponent", UPDATES,
        "prioritized: importance-sampling exponent β of this update's draw"),
    Tag("replay/per_importance_min", "weight", UPDATES,
        "prioritized: smallest importance weight in the batch (how much a row's loss was scaled down)"),
    Tag("replay/live_planes", "planes", UPDATES,
        "`replay.share_frames`: distinct image planes stored"),
    Tag("perf/updates_per_s", "1/s", UPDATES,
        "learner updates per second since the previous log point"),
    Tag("perf/samples_per_s", "1/s", UPDATES,
        "transitions received per second since the previous log point"),
    Tag("perf/sample_blocked_seconds", "s", UPDATES,
        "time the learner waited for the replay ratio to admit an update (total)"),
    Tag("perf/insert_blocked_seconds", "s", UPDATES,
        "time inserts waited for the learner to catch up (total)"),
    Tag("actor/steps_per_s", "1/s", UPDATES,
        "supervisor: env steps per second of the actors heard from lately, summed"),
    Tag("actor/samples_per_s", "1/s", UPDATES,
        "supervisor: transitions sent per second by those actors, summed"),
    Tag("actor/alive", "actors", UPDATES,
        "supervisor: actors alive (heartbeating)"),
    Tag("actor/recent_return", "return", ENV_STEPS,
        "supervisor: mean over actors of each one's mean return of its last 20 episodes"),
    Tag("supervisor/restarts", "restarts", UPDATES,
        "processes the supervisor restarted (total)"),
    Tag("supervisor/bad_heartbeats", "messages", UPDATES,
        "malformed heartbeats dropped (total)"),
)
# fmt: on

# Every Prometheus metric /metrics exports, in the order docs/metrics.md lists them.
# fmt: off
PROMETHEUS: tuple[Metric, ...] = (
    Metric("zmqrl_up", GAUGE, ANY_ROLE, FEED_UP, "1/0",
           "whether the slot's process is alive: heartbeating and not exiting"),
    Metric("zmqrl_restarts_total", COUNTER, ANY_ROLE, FEED_RESTARTS, "restarts",
           "restarts of the slot's process, by the supervisor (launch) or by its orchestrator (supervise)"),
    Metric("zmqrl_heartbeat_age_seconds", GAUGE, ANY_ROLE, FEED_HEARTBEAT_AGE, "seconds",
           "seconds since the slot's latest heartbeat"),
    Metric("zmqrl_bad_messages_total", COUNTER, ANY_ROLE, FEED_BAD, "messages",
           "messages dropped as malformed, unfit, forged or refused, by `reason`",
           labels=("role", "id", "reason")),
    Metric("zmqrl_loop_iterations_total", COUNTER, ANY_ROLE, "progress", "turns",
           "turns of the role's main loop (what the supervisor's hung check watches)"),
    Metric("zmqrl_weights_version", GAUGE, ANY_ROLE, "weights_version", "version",
           "learner: latest published weights version; actor, evaluator: the version it holds"),
    Metric("zmqrl_run_info", GAUGE, "supervisor", FEED_RUN, "1",
           "always 1; its labels say which run this is", labels=("run", "command", "agent", "env")),
    Metric("zmqrl_learner_updates_total", COUNTER, "learner", "updates", "updates",
           "gradient updates (restored ones included after a resume)"),
    Metric("zmqrl_learner_samples_total", COUNTER, "learner", "samples", "transitions",
           "transitions received from actors"),
    Metric("zmqrl_learner_batches_total", COUNTER, "learner", "batches", "messages",
           "sample messages received"),
    Metric("zmqrl_learner_episodes_total", COUNTER, "learner", "episodes", "episodes",
           "actors' episodes the learner heard of"),
    Metric("zmqrl_learner_updates_per_second", GAUGE, "learner", "updates_per_s", "1/s",
           "updates per training second since start (for a recent rate: `rate()` of the counter)"),
    Metric("zmqrl_learner_samples_per_second", GAUGE, "learner", "samples_per_s", "1/s",
           "transitions received per training second since start"),
    Metric("zmqrl_learner_training_seconds_total", COUNTER, "learner", "duration", "seconds",
           "training seconds (restored ones included)"),
    Metric("zmqrl_learner_policy_lag_versions", GAUGE, "learner", "policy_lag", "versions",
           "mean policy lag of the recent batches: published version minus the version they were acted with"),
    Metric("zmqrl_learner_policy_lag_sampled_versions", HISTOGRAM, "learner", "policy_lag", "versions",
           "that recent mean, observed once per learner heartbeat (its distribution over the run)",
           buckets=LAG_BUCKETS),
    Metric("zmqrl_learner_stale_batches_total", COUNTER, "learner", "stale_batches", "batches",
           "batches dropped for a lag above `learner.max_policy_lag`"),
    Metric("zmqrl_learner_nonfinite_updates_total", COUNTER, "learner", "nonfinite_updates", "updates",
           "updates skipped for a non-finite loss or gradient"),
    Metric("zmqrl_learner_checkpoints_deferred_total", COUNTER, "learner", "checkpoints_deferred",
           "checkpoints", "checkpoints due while the previous one was being written (taken right after it)"),
    Metric("zmqrl_learner_lost_batches_total", COUNTER, "learner", "lost_batches", "batches",
           "batches missing by `seq`, summed over actors"),
    Metric("zmqrl_learner_reordered_batches_total", COUNTER, "learner", "reordered_batches", "batches",
           "batches arrived late by `seq`, summed over actors"),
    Metric("zmqrl_learner_actor_restarts_total", COUNTER, "learner", "actor_restarts", "restarts",
           "actor restarts seen in the batches' `seq`"),
    Metric("zmqrl_learner_replay_size", GAUGE, "learner", "replay_size", "transitions",
           "transitions in the replay buffer (on-policy: env steps of rollouts queued)"),
    Metric("zmqrl_learner_replay_capacity", GAUGE, "learner", "replay_capacity", "transitions",
           "the most the buffer (on-policy: the rollout queue) holds"),
    Metric("zmqrl_learner_replay_bytes", GAUGE, "learner", "replay_mb", "bytes",
           "memory the replay buffer uses", scale=2.0**20),
    Metric("zmqrl_learner_replay_ratio", GAUGE, "learner", "samples_per_insert", "ratio",
           "transitions sampled per transition inserted, since start"),
    Metric("zmqrl_learner_sample_blocked_seconds_total", COUNTER, "learner", "sample_blocked_seconds",
           "seconds", "time updates waited for the replay ratio to admit them"),
    Metric("zmqrl_learner_insert_blocked_seconds_total", COUNTER, "learner", "insert_blocked_seconds",
           "seconds", "time inserts waited for the learner to catch up"),
    Metric("zmqrl_learner_clipped_priorities_total", COUNTER, "learner", "clipped_priorities", "rows",
           "prioritized replay: priorities stored lowered by a bound"),
    Metric("zmqrl_learner_stale_priority_updates_total", COUNTER, "learner", "stale_priority_updates", "rows",
           "prioritized replay: priority updates skipped, their row overwritten meanwhile"),
    Metric("zmqrl_learner_max_priority", GAUGE, "learner", "max_priority", "priority",
           "prioritized replay: largest priority measured (what new rows without one get)"),
    Metric("zmqrl_learner_replay_live_planes", GAUGE, "learner", "live_planes", "planes",
           "`replay.share_frames`: distinct image planes stored"),
    Metric("zmqrl_learner_queue_rollouts", GAUGE, "learner", "queue_rollouts", "rollouts",
           "on-policy: rollouts waiting in the learner's queue"),
    Metric("zmqrl_learner_stale_samples_total", COUNTER, "learner", "stale_samples", "transitions",
           "transitions of the batches dropped for their lag"),
    Metric("zmqrl_learner_untracked_batches_total", COUNTER, "learner", "untracked_batches", "batches",
           "batches from actor ids beyond the most the learner tracks by `seq`"),
    Metric("zmqrl_learner_evaluations_total", COUNTER, "learner", "evaluations", "evaluations",
           "evaluations made by the learner's own eval envs"),
    Metric("zmqrl_learner_eval_return", GAUGE, "learner", "eval_return", "return",
           "mean return of the latest evaluation"),
    Metric("zmqrl_learner_eval_best_return", GAUGE, "learner", "eval_best", "return",
           "best evaluation return so far"),
    Metric("zmqrl_actor_env_steps_total", COUNTER, "actor", "steps", "env steps",
           "env steps taken (all sub-envs of a vector actor)"),
    Metric("zmqrl_actor_episodes_total", COUNTER, "actor", "episodes", "episodes",
           "episodes finished"),
    Metric("zmqrl_actor_samples_total", COUNTER, "actor", "samples", "transitions",
           "transitions sent to the learner"),
    Metric("zmqrl_actor_batches_total", COUNTER, "actor", "batches", "messages",
           "sample messages sent"),
    Metric("zmqrl_actor_rollouts_total", COUNTER, "actor", "rollouts", "rollouts",
           "on-policy: rollouts completed"),
    Metric("zmqrl_actor_weights_loaded_total", COUNTER, "actor", "weights_loaded", "loads",
           "weights versions loaded into its policy"),
    Metric("zmqrl_actor_env_steps_per_second", GAUGE, "actor", "steps_per_s", "1/s",
           "env steps per second since the process started (recent: `rate()` of the counter)"),
    Metric("zmqrl_actor_samples_per_second", GAUGE, "actor", "samples_per_s", "1/s",
           "transitions sent per second since the process started"),
    Metric("zmqrl_actor_blocked_seconds_total", COUNTER, "actor", "blocked_seconds", "seconds",
           "time spent waiting on a full learner queue"),
    Metric("zmqrl_actor_paced_seconds_total", COUNTER, "actor", "paced_seconds", "seconds",
           "time slept under `actor.max_steps_per_s`"),
    Metric("zmqrl_actor_priority_seconds_total", COUNTER, "actor", "priority_seconds", "seconds",
           "time spent computing initial priorities (prioritized replay)"),
    Metric("zmqrl_actor_uptime_seconds", GAUGE, "actor", "duration", "seconds",
           "seconds since the actor process started"),
    Metric("zmqrl_actor_epsilon", GAUGE, "actor", "epsilon", "probability",
           "exploration epsilon now (a vector actor: the mean of its sub-envs')"),
    Metric("zmqrl_actor_envs", GAUGE, "actor", "envs", "envs",
           "environments the actor steps"),
    Metric("zmqrl_actor_recent_return", GAUGE, "actor", "recent_return", "return",
           "mean return of its last 20 episodes (with exploration)"),
    Metric("zmqrl_evaluator_evaluations_total", COUNTER, "evaluator", "evaluations", "evaluations",
           "evaluations made"),
    Metric("zmqrl_evaluator_uptime_seconds", GAUGE, "evaluator", "duration", "seconds",
           "seconds since the evaluator process started"),
    Metric("zmqrl_evaluator_evaluated_version", GAUGE, "evaluator", "evaluated_version", "version",
           "the weights version of the latest evaluation"),
    Metric("zmqrl_evaluator_eval_return", GAUGE, "evaluator", "eval_return", "return",
           "mean return of the latest evaluation"),
    Metric("zmqrl_evaluator_eval_best_return", GAUGE, "evaluator", "eval_best", "return",
           "best evaluation return so far"),
    Metric("zmqrl_evaluator_eval_duration_seconds", GAUGE, "evaluator", "eval_seconds", "seconds",
           "how long the latest evaluation took"),
)
# fmt: on


def tag_table() -> dict[str, Tag]:
    """:data:`TAGS` by tag."""
    return {t.tag: t for t in TAGS}


def metric_table() -> dict[str, Metric]:
    """:data:`PROMETHEUS` by name."""
    return {m.name: m for m in PROMETHEUS}


def unexported(role: str, counters: set[str]) -> set[str]:
    """Which of a role's heartbeat counters no metric reads and :data:`LEFT_OUT` does not explain."""
    fed = {m.feed for m in PROMETHEUS if m.role in (ANY_ROLE, role)} | set(BAD_REASONS)
    return counters - fed - LEFT_OUT.keys()


def feed_text(metric: Metric) -> str:
    """Where a metric's value comes from, in the docs' words."""
    if metric.feed in FEED_TEXT:
        return FEED_TEXT[metric.feed]
    whose = "every role's" if metric.role == ANY_ROLE else f"the {metric.role}'s"
    scaled = f" × {metric.scale:.0f}" if metric.scale != 1.0 else ""
    return f"{whose} heartbeat counter `{metric.feed}`{scaled}"
