"""Range checks of a whole config that types alone cannot express.

Kept apart from :mod:`zmqrl.config` (the sections) so that each new setting's check sits in one
list, and an error can be blamed on the variable or ``--set`` that really gave the value.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from zmqrl.errors import ConfigError
from zmqrl.metrics.trackers import logging_problem

if TYPE_CHECKING:
    from zmqrl.config_sections import Config

# Names in a keys directory (zmqrl/transport/keys.py) that no client key pair may take: the
# server's pair and the directory of authorized public keys.
SERVER_NAME = "server"
AUTHORIZED_DIR = "authorized"
# Client names become file names: keep them to one plain path component.
_CLIENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# Maps handed whole to code the config names (an env's constructor): their values are its to check.
FREE_FORM_KEYS = ("env.kwargs",)


def client_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a client key pair (it becomes a file name), or None if it can.

    Pure, so that config checking (transport.key_name) and ``zmqrl keys`` apply the same rule;
    here rather than in transport/keys.py, so that checking a config imports no zmq.
    """
    if not _CLIENT_NAME.fullmatch(name) or name in (SERVER_NAME, AUTHORIZED_DIR):
        return (
            f"bad client name {name!r}: use 1-64 letters, digits, '.', '_' or '-' "
            f"(not starting with '.', and not {SERVER_NAME!r} or {AUTHORIZED_DIR!r})"
        )
    return None


def check_config(cfg: Config, source: str, assigned: list[tuple[str, str]] | None = None) -> None:
    """Range checks that types alone cannot express.

    A failed check is blamed on the last variable or --set in ``assigned`` (dotted key, label) whose
    key the message names, else on ``source``: the user is sent to the value they actually gave.
    """

    def fail(message: str) -> ConfigError:
        for key, label in reversed(assigned or []):
            if re.search(rf"(?<![\w.]){re.escape(key)}(?!\w)", message):
                return ConfigError(f"{label}: {message}")
        return ConfigError(f"{source}: {message}")

    if problem := nonfinite_problem(cfg.to_dict()):
        raise fail(problem)
    name = cfg.run.name
    problems: list[tuple[str, bool]] = [
        (
            f"run.name {name!r} must be one folder name (no '/', not '.' or '..'): the run's directory "
            "is run.dir/run.name, so give the parent as run.dir",
            bool(name) and "/" not in name and "\0" not in name and name not in (".", ".."),
        ),
        ("replay.capacity must be >= 1", cfg.replay.capacity >= 1),
        ("learner.max_updates must be >= 1", cfg.learner.max_updates >= 1),
        ("learner.min_replay_size must be >= 1", cfg.learner.min_replay_size >= 1),
        (
            "learner.min_replay_size must not exceed replay.capacity",
            cfg.learner.min_replay_size <= cfg.replay.capacity,
        ),
        ("learner.sync_interval must be >= 1", cfg.learner.sync_interval >= 1),
        ("learner.republish_seconds must be > 0", cfg.learner.republish_seconds > 0),
        (
            "learner.max_seconds must be > 0 (or null for no limit)",
            cfg.learner.max_seconds is None or cfg.learner.max_seconds > 0,
        ),
        ("learner.progress_seconds must be > 0", cfg.learner.progress_seconds > 0),
        (
            "env.max_episode_steps must be >= 1 (or null)",
            cfg.env.max_episode_steps is None or cfg.env.max_episode_steps >= 1,
        ),
        ("actor.max_steps must be >= 1 (or null)", cfg.actor.max_steps is None or cfg.actor.max_steps >= 1),
        ("supervisor.startup_timeout must be > 0", cfg.supervisor.startup_timeout > 0),
        (
            "supervisor.progress_timeout must exceed supervisor.heartbeat_timeout",
            cfg.supervisor.progress_timeout > cfg.supervisor.heartbeat_timeout,
        ),
        ("supervisor.join_timeout must be >= 0", cfg.supervisor.join_timeout >= 0),
        ("supervisor.healthy_seconds must be >= 0", cfg.supervisor.healthy_seconds >= 0),
        ("supervisor.actor_progress_timeout must be > 0", cfg.supervisor.actor_progress_timeout > 0),
        ("supervisor.extra_slots must be >= 0", cfg.supervisor.extra_slots >= 0),
        ("supervisor.progress_seconds must be > 0", cfg.supervisor.progress_seconds > 0),
        ("supervisor.no_progress_seconds must be >= 0 (0: off)", cfg.supervisor.no_progress_seconds >= 0),
        ("learner.eval_interval must be >= 0", cfg.learner.eval_interval >= 0),
        ("learner.eval_episodes must be >= 1", cfg.learner.eval_episodes >= 1),
        ("learner.checkpoint_interval must be >= 0", cfg.learner.checkpoint_interval >= 0),
        ("learner.log_interval must be >= 1", cfg.learner.log_interval >= 1),
        ("learner.target_hold must be >= 1", cfg.learner.target_hold >= 1),
        (
            "learner.stop_at_target needs learner.target_return (the return to hold)",
            not cfg.learner.stop_at_target or cfg.learner.target_return is not None,
        ),
        ("checkpoint.keep must be >= 1", cfg.checkpoint.keep >= 1),
        ("checkpoint.replay_max_mb must be >= 1", cfg.checkpoint.replay_max_mb >= 1),
        ("learner.torch_threads must be >= 1", cfg.learner.torch_threads >= 1),
        (
            "learner.samples_per_insert must be > 0 (or null for no limit)",
            cfg.learner.samples_per_insert is None or cfg.learner.samples_per_insert > 0,
        ),
        ("learner.samples_per_insert_tolerance must be >= 1", cfg.learner.samples_per_insert_tolerance >= 1),
        (
            "learner.ingest_max_share must be in (0, 1] (or null for no cap)",
            cfg.learner.ingest_max_share is None or 0 < cfg.learner.ingest_max_share <= 1,
        ),
        (
            "learner.max_policy_lag must be >= 1 (or null)",
            cfg.learner.max_policy_lag is None or cfg.learner.max_policy_lag >= 1,
        ),
        ("replay.alpha must be >= 0", cfg.replay.alpha >= 0),
        ("replay.beta must be in [0, 1]", 0.0 <= cfg.replay.beta <= 1.0),
        ("replay.beta_updates must be >= 1", cfg.replay.beta_updates >= 1),
        ("replay.priority_eps must be > 0", cfg.replay.priority_eps > 0),
        (
            "replay.max_initial_priority_ratio must be >= 1 (and finite)",
            1.0 <= cfg.replay.max_initial_priority_ratio < float("inf"),
        ),
        ("replay.max_priority must be > 0 (and finite)", 0.0 < cfg.replay.max_priority < float("inf")),
        ("replay.max_draw_ratio must be >= 1 (and finite)", 1.0 <= cfg.replay.max_draw_ratio < float("inf")),
        ("learner.max_nonfinite_updates must be >= 1", cfg.learner.max_nonfinite_updates >= 1),
        (
            "transport.max_abs_reward must be > 0 (and finite)",
            0.0 < cfg.transport.max_abs_reward < float("inf"),
        ),
        ("transport.max_abs_obs must be > 0 (and finite)", 0.0 < cfg.transport.max_abs_obs < float("inf")),
        ("actor.envs_per_actor must be >= 1", cfg.actor.envs_per_actor >= 1),
        ("evaluator.episodes must be >= 1", cfg.evaluator.episodes >= 1),
        ("evaluator.interval_seconds must be >= 0", cfg.evaluator.interval_seconds >= 0),
        ("evaluator.torch_threads must be >= 1", cfg.evaluator.torch_threads >= 1),
        ("env.preprocess must be none or atari", cfg.env.preprocess in ("none", "atari")),
        ("env.atari.noop_max must be >= 0", cfg.env.atari.noop_max >= 0),
        ("env.atari.frame_skip must be >= 1", cfg.env.atari.frame_skip >= 1),
        ("env.atari.screen_size must be >= 1", cfg.env.atari.screen_size >= 1),
        ("env.atari.frame_stack must be >= 1", cfg.env.atari.frame_stack >= 1),
        ("actor.num_actors must be >= 1", cfg.actor.num_actors >= 1),
        ("actor.send_batch must be >= 1", cfg.actor.send_batch >= 1),
        ("actor.epsilon must be in [0, 1]", 0.0 <= cfg.actor.epsilon <= 1.0),
        ("actor.epsilon_alpha must be >= 0", cfg.actor.epsilon_alpha >= 0),
        ("actor.epsilon_decay_steps must be >= 0", cfg.actor.epsilon_decay_steps >= 0),
        (
            "actor.max_steps_per_s must be > 0 (or null)",
            cfg.actor.max_steps_per_s is None or cfg.actor.max_steps_per_s > 0,
        ),
        ("actor.weights_poll_steps must be >= 1", cfg.actor.weights_poll_steps >= 1),
        ("actor.rollout_length must be >= 1", cfg.actor.rollout_length >= 1),
        (
            "learner.queue_steps must be >= 1 (or null: two batches)",
            cfg.learner.queue_steps is None or cfg.learner.queue_steps >= 1,
        ),
        ("transport.samples_hwm must be >= 1", cfg.transport.samples_hwm >= 1),
        ("transport.samples_buffer_kb must be >= 0", cfg.transport.samples_buffer_kb >= 0),
        ("transport.max_message_mb must be >= 1", cfg.transport.max_message_mb >= 1),
        (
            "transport.connect_timeout must be > 0 (or null: wait forever)",
            cfg.transport.connect_timeout is None or cfg.transport.connect_timeout > 0,
        ),
        ("supervisor.heartbeat_interval must be > 0", cfg.supervisor.heartbeat_interval > 0),
        (
            "supervisor.heartbeat_timeout must exceed supervisor.heartbeat_interval",
            cfg.supervisor.heartbeat_timeout > cfg.supervisor.heartbeat_interval,
        ),
        ("supervisor.max_restarts must be >= 0", cfg.supervisor.max_restarts >= 0),
        ("supervisor.restart_window must be > 0", cfg.supervisor.restart_window > 0),
        ("supervisor.restart_backoff must be >= 0", cfg.supervisor.restart_backoff >= 0),
        (
            "supervisor.restart_backoff_max must be >= supervisor.restart_backoff",
            cfg.supervisor.restart_backoff_max >= cfg.supervisor.restart_backoff,
        ),
        ("supervisor.stop_grace must be > 0", cfg.supervisor.stop_grace > 0),
        (
            "run.log_level must be debug, info, warning or error",
            cfg.run.log_level in ("debug", "info", "warning", "error"),
        ),
    ]
    for message, ok in problems:
        if not ok:
            raise fail(message)
    endpoints = [getattr(cfg.transport, name) for name in ("samples", "weights", "heartbeat", "control")]
    fixed = [e for e in endpoints if not e.endswith(":0")]  # port 0: the OS picks a free port for each
    if len(set(fixed)) != len(fixed):
        raise fail(
            "transport.samples, transport.weights, transport.heartbeat and transport.control must all differ"
        )
    if not cfg.supervisor.status.endswith(":0") and cfg.supervisor.status in endpoints:
        raise fail("supervisor.status must differ from the transport endpoints")
    for name in ("samples", "weights", "heartbeat", "control"):
        endpoint = getattr(cfg.transport, name)
        if not endpoint.startswith(("tcp://", "ipc://", "inproc://")):
            raise fail(f"transport.{name} must be a ZeroMQ endpoint like tcp://127.0.0.1:5555")
    if not cfg.supervisor.status.startswith(("tcp://", "ipc://", "inproc://")):
        raise fail("supervisor.status must be a ZeroMQ endpoint like tcp://127.0.0.1:5559 (or port 0)")
    if problem := client_name_problem(cfg.transport.key_name):
        raise fail(f"transport.key_name: {problem}")
    check = getattr(cfg.agent, "check", None)  # optional for a plugin's config class
    try:
        if check is not None:
            check()
    except ValueError as exc:
        raise fail(str(exc)) from None
    if problem := on_policy_problem(cfg):
        raise fail(problem)
    if problem := logging_problem(cfg):
        raise fail(problem)
    for problem in (metrics_http_problem(cfg), health_http_problem(cfg)):
        if problem:
            raise fail(problem)


def nonfinite_problem(values: Mapping[str, Any], prefix: str = "") -> str | None:
    """The first setting holding NaN or an infinity, or None. No setting means either: a range
    check passes NaN where it is written ``x > 0`` or ``x <= 0`` (NaN compares false), an
    infinite step size or gradient bound trains nothing without failing, and "no limit" is null
    wherever a setting has one. A plugin's agent settings are held to this too."""
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if dotted in FREE_FORM_KEYS:
            continue
        if isinstance(value, Mapping):
            if problem := nonfinite_problem(value, f"{dotted}."):
                return problem
            continue
        items = value if isinstance(value, (list, tuple)) else [value]
        if any(isinstance(item, float) and not math.isfinite(item) for item in items):
            return f"{dotted} must be a finite number (null where the setting means none), got {value}"
    return None


def on_policy_problem(cfg: Config) -> str | None:
    """What in an on-policy run's sizes cannot work (a batch of whole rollouts, a queue of at least
    a batch, each actor's rollouts fitting one message the queue always has room for), or None."""
    from zmqrl.agents.registry import get_agent
    from zmqrl.spec import message_rows, queue_rows

    try:
        if not get_agent(cfg.agent.kind).on_policy:
            return None
    except ConfigError:
        return None  # an unknown kind is reported where the agent is built, with the names known
    try:
        batch_rows, capacity_rows = queue_rows(
            cfg.agent.batch_size, cfg.actor.rollout_length, cfg.learner.queue_steps
        )
    except ValueError as exc:
        return str(exc)
    minibatches = getattr(cfg.agent, "minibatches", 1)
    if minibatches > batch_rows:
        return (
            f"agent.minibatches {minibatches} is more than the {batch_rows} rollouts of a batch "
            f"(agent.batch_size / actor.rollout_length): a minibatch is whole rollouts"
        )
    most = message_rows(batch_rows, capacity_rows)
    if cfg.actor.envs_per_actor > most:
        return (
            f"actor.envs_per_actor {cfg.actor.envs_per_actor}: each actor sends one rollout per env in one "
            f"message, and the learner's queue always has room for at most {most}: raise "
            f"learner.queue_steps (now {capacity_rows * cfg.actor.rollout_length} steps) or lower "
            f"actor.envs_per_actor"
        )
    return None


def parse_http_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[v6]:PORT`` for an IPv6 literal) as ``(host, port)``; ValueError with a
    reason otherwise. The one syntax of every HTTP setting (``supervisor.metrics_http``,
    ``supervisor.health_http``), here so the config check and the servers read it alike."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"write an IPv6 host in brackets ([::1]:PORT), got {text!r}")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT with a port from 0 to 65535, got {text!r}")
    return host, int(port)


def _http_setting_problem(key: str, value: str | None, example: str) -> str | None:
    if value is None:  # off
        return None
    try:
        parse_http_address(value)
    except ValueError as exc:
        return f"{key}: {exc} ({example})"
    return None


def metrics_http_problem(cfg: Config) -> str | None:
    """What is wrong with ``supervisor.metrics_http`` (the supervisor's Prometheus endpoint)."""
    return _http_setting_problem(
        "supervisor.metrics_http", cfg.supervisor.metrics_http, "e.g. 127.0.0.1:9464; port 0: any free port"
    )


def health_http_problem(cfg: Config) -> str | None:
    """What is wrong with ``supervisor.health_http`` (every role's /healthz and /readyz)."""
    return _http_setting_problem(
        "supervisor.health_http",
        cfg.supervisor.health_http,
        "e.g. 127.0.0.1:0 for any free port, 0.0.0.0:8080 in a container",
    )
