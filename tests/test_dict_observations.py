"""Dict observations of Box entries: records at the env's edge, one wire array per key with each
key's bounds checked, replay and its snapshots keyed likewise (zmqrl.types)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gymnasium as gym
import msgpack
import numpy as np
import pytest

from tests.conftest import REPO, launch_to_the_end
from zmqrl.actor.nstep_log import NStepLog
from zmqrl.checkpoints.snapshots import SnapshotUnfit, read_replay_snapshot, write_replay_snapshot
from zmqrl.config import EnvConfig
from zmqrl.config_sections import ReplayConfig
from zmqrl.envs.factory import make_env, make_vector_env, sample_spec
from zmqrl.envs.grid_goal import GRID_GOAL, GridGoal
from zmqrl.errors import EnvError
from zmqrl.replay.factory import make_replay
from zmqrl.runtime.run_fingerprint import run_fingerprint
from zmqrl.spec import SampleSpec
from zmqrl.transport import wire
from zmqrl.transport.decoding import load_samples
from zmqrl.transport.messages import SamplesMsg, WireError
from zmqrl.types import (
    ObsEntry,
    RolloutBatch,
    TransitionBatch,
    as_bytes,
    from_bytes,
    record_dtype,
    to_records,
)

ENTRIES = (
    ObsEntry("image", (2, 5, 5), "uint8", 0.0, 1.0),
    ObsEntry("state", (3,), "float32", (-1.0, -2.0, -3.0), (1.0, 2.0, 3.0)),
)


def keyed_spec(**extra: object) -> SampleSpec:
    fields: dict[str, object] = {"obs_entries": ENTRIES, "num_actions": 4, **extra}
    return SampleSpec(obs_shape=(), obs_dtype="record", action_shape=(), action_dtype="int64", **fields)  # type: ignore[arg-type]


def observations(n: int, seed: int = 0, lead: tuple[int, ...] = ()) -> np.ndarray:
    rng = np.random.default_rng(seed)
    obs = np.zeros((*lead, n), record_dtype(ENTRIES))
    obs["image"] = rng.integers(0, 2, obs["image"].shape)
    obs["state"] = rng.uniform(-1, 1, obs["state"].shape) * np.array([1, 2, 3])
    return obs


def transitions(n: int = 8, seed: int = 0) -> TransitionBatch:
    return TransitionBatch(
        observations(n, seed),
        np.arange(n, dtype=np.int64) % 4,
        np.linspace(-1, 1, n, dtype=np.float32),
        observations(n, seed + 1),
        np.full(n, 0.99, np.float32),
    )


def array_names(frames: list[bytes | memoryview]) -> list[str]:
    return [d["name"] for d in msgpack.unpackb(bytes(frames[0]))["arrays"]]


# ------------------------------------------------------------------------------ records and spec


def test_records_keep_each_key_in_its_own_dtype_and_cross_to_torch_as_their_bytes() -> None:
    dtype = record_dtype(ENTRIES)
    assert dtype["image"].base == np.uint8 and dtype["state"].base == np.float32
    assert dtype.fields is not None and dtype.fields["state"][1] % 4 == 0  # aligned: a view, not a copy
    obs = observations(6)
    raw = as_bytes(obs)
    assert raw.shape == (6, dtype.itemsize) and raw.dtype == np.uint8 and np.shares_memory(raw, obs)
    np.testing.assert_array_equal(from_bytes(raw, dtype), obs)
    assert as_bytes(np.zeros((2, 3), np.float32)).shape == (2, 3)  # a plain array passes as it is


def test_a_dict_becomes_records_one_or_a_batch_and_wrong_keys_are_named() -> None:
    dtype = record_dtype(ENTRIES)
    one = to_records({"image": np.ones((2, 5, 5), np.uint8), "state": np.zeros(3, np.float32)}, dtype)
    assert one.shape == () and one["image"].sum() == 50
    batch = to_records({"image": np.ones((4, 2, 5, 5), np.uint8), "state": np.zeros((4, 3))}, dtype)
    assert batch.shape == (4,)
    with pytest.raises(ValueError, match="keys"):
        to_records({"image": np.ones((2, 5, 5))}, dtype)
    with pytest.raises(ValueError, match="'state' must be"):
        to_records({"image": np.ones((4, 2, 5, 5)), "state": np.zeros((3, 3))}, dtype)


def test_a_spec_with_entries_checks_keys_and_refuses_masks() -> None:
    spec = keyed_spec()
    assert spec.obs_np_dtype == record_dtype(ENTRIES) and spec.obs_bytes == record_dtype(ENTRIES).itemsize
    assert spec.entry_limits("image") is not None  # uint8 in [0, 1]: tighter than the dtype
    with pytest.raises(ValueError, match="identifier"):
        keyed_spec(obs_entries=(ObsEntry("bad key", (1,), "float32"),))
    with pytest.raises(ValueError, match="distinct"):
        keyed_spec(obs_entries=(ENTRIES[1], ENTRIES[1]))
    with pytest.raises(ValueError, match="obs_entries"):
        SampleSpec(obs_shape=(), obs_dtype="record", action_shape=(), action_dtype="int64", num_actions=2)
    with pytest.raises(ValueError, match="action_mask"):
        keyed_spec(action_mask=True)


# ------------------------------------------------------------------------------ the env's edge


def test_make_env_gives_records_and_the_spec_one_entry_per_key() -> None:
    env = make_env(EnvConfig(id=GRID_GOAL))
    obs, _ = env.reset(seed=3)
    spec = sample_spec(env)
    assert obs.shape == () and obs.dtype == spec.obs_np_dtype
    assert [(e.key, e.dtype, e.shape) for e in spec.obs_entries] == [
        ("goal", "float32", (2,)),
        ("grid", "uint8", (1, 7, 7)),
    ]
    assert obs["grid"].sum() == 1 and 0.0 <= obs["goal"].min() <= obs["goal"].max() <= 1.0
    env.close()
    vec = make_vector_env(EnvConfig(id=GRID_GOAL), 3)
    batch, _ = vec.reset(seed=0)
    assert batch.shape == (3,) and batch.dtype == spec.obs_np_dtype and sample_spec(vec) == spec
    batch, *_ = vec.step(np.zeros(3, np.int64))
    assert batch.shape == (3,) and batch["grid"].reshape(3, -1).sum(axis=1).tolist() == [1, 1, 1]
    vec.close()


def test_grid_goal_needs_both_keys_and_scores_one_for_the_shortest_walk() -> None:
    env = GridGoal()
    obs, _ = env.reset(seed=0)
    walker = np.argwhere(obs["grid"][0])[0]
    goal = np.rint(obs["goal"] * (env.size - 1)).astype(int)
    total, done = 0.0, False
    while not done:
        delta = goal - walker
        action = (0 if delta[0] < 0 else 1) if delta[0] else (2 if delta[1] < 0 else 3)
        obs, reward, terminated, truncated, _ = env.step(action)
        walker, total, done = np.argwhere(obs["grid"][0])[0], total + reward, terminated or truncated
    assert total == 1.0 and terminated


def test_a_dict_with_a_non_box_entry_is_refused_naming_the_key() -> None:
    from zmqrl.envs.records import obs_entries

    with pytest.raises(EnvError, match="entry 'n' is Discrete"):
        obs_entries(gym.spaces.Dict({"n": gym.spaces.Discrete(3)}))
    with pytest.raises(EnvError, match="identifier"):
        obs_entries(gym.spaces.Dict({"a-b": gym.spaces.Box(0, 1, (2,))}))


def test_the_fingerprint_names_each_key_so_actors_of_another_dict_are_refused(tmp_path: Path) -> None:
    from tests.conftest import tiny_config

    cfg = tiny_config(tmp_path)
    prints = run_fingerprint(cfg, keyed_spec())
    assert prints["obs.keys"] == ["image uint8 [2, 5, 5]", "state float32 [3]"]
    other = (ENTRIES[0], ObsEntry("state", (4,), "float32"))
    assert run_fingerprint(cfg, keyed_spec(obs_entries=other))["obs.keys"] != prints["obs.keys"]


# ------------------------------------------------------------------------------ the wire


def test_transitions_travel_one_array_per_key_and_come_back_as_records() -> None:
    batch = transitions()
    frames = wire.dump(SamplesMsg(1, 0, 0, batch, []))
    assert array_names(frames) == [
        "obs.image",
        "obs.state",
        "action",
        "reward",
        "next_obs.image",
        "next_obs.state",
        "discount",
    ]
    got = load_samples(frames, keyed_spec()).batch
    assert isinstance(got, TransitionBatch)
    for a, b in zip(got, batch, strict=True):
        np.testing.assert_array_equal(a, b)


def test_rollouts_travel_one_array_per_key_final_observations_too() -> None:
    rows, steps = 2, 3
    truncated = np.zeros((rows, steps), bool)
    truncated[1, 1] = True
    batch = RolloutBatch(
        observations(steps + 1, lead=(rows,)),
        np.zeros((rows, steps), np.int64),
        np.zeros((rows, steps), np.float32),
        np.zeros((rows, steps), bool),
        truncated,
        np.full((rows, steps), -1.0, np.float32),
        observations(1, seed=5),
    )
    frames = wire.dump(SamplesMsg(1, 0, 0, batch, []))
    assert "final_obs.state" in array_names(frames)
    got = load_samples(frames, keyed_spec(rollout_length=steps)).batch
    assert isinstance(got, RolloutBatch)
    np.testing.assert_array_equal(got.obs, batch.obs)
    np.testing.assert_array_equal(got.final_obs, batch.final_obs)


@pytest.mark.parametrize(
    ("column", "key", "where", "value", "said"),
    [
        ("obs", "state", (3, 1), 2.5, "obs.state component 1 is 2.5"),
        ("next_obs", "state", (0, 2), np.nan, "next_obs.state component 2 is nan"),
        ("obs", "image", (5, 1, 0, 0), 2, "obs.image component 25 is 2"),
        ("next_obs", "state", (7, 0), np.inf, "next_obs.state"),
    ],
)
def test_each_key_is_checked_against_its_own_bounds(
    column: str, key: str, where: tuple[int, ...], value: float, said: str
) -> None:
    batch = transitions()
    bad = getattr(batch, column).copy()
    bad[key][where] = value
    with pytest.raises(WireError, match=said.replace("[", r"\[")):
        load_samples(wire.dump(SamplesMsg(1, 0, 0, batch._replace(**{column: bad}), [])), keyed_spec())


def hand_made(names_shapes: list[tuple[str, str, list[int]]]) -> list[bytes]:
    """A samples message built field by field, as a foreign peer might."""
    arrays = [{"name": n, "dtype": d, "shape": s} for n, d, s in names_shapes]
    header = {
        "proto": wire.PROTO_VERSION,
        "kind": "samples",
        "actor_id": 1,
        "seq": 0,
        "weights_version": 0,
        "episodes": [],
        "arrays": arrays,
    }
    frames = [msgpack.packb(header)]
    for _, dtype, shape in names_shapes:
        frames.append(np.zeros(shape, dtype).tobytes())
    return frames


GOOD = [
    ("obs.image", "uint8", [4, 2, 5, 5]),
    ("obs.state", "float32", [4, 3]),
    ("action", "int64", [4]),
    ("reward", "float32", [4]),
    ("next_obs.image", "uint8", [4, 2, 5, 5]),
    ("next_obs.state", "float32", [4, 3]),
    ("discount", "float32", [4]),
]


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ({2: ("action.x", "int64", [4])}, "only"),
        ({1: ("obs.image", "float32", [4, 3])}, "repeated key"),
        ({1: ("obs.st-ate", "float32", [4, 3])}, "bad or repeated key"),
        ({1: ("obs.state", "float32", [5, 3])}, "leading dimensions"),
        ({1: ("obs.state", "float32", [4])}, "more than 1 dimensions"),
        ({5: ("next_obs.goal", "float32", [4, 3])}, "next_obs is record {image: uint8 [2, 5, 5], goal"),
        ({1: ("obs.state", "float64", [4, 3])}, "obs is record {image: uint8 [2, 5, 5], state: float64"),
        ({4: ("next_obs", "float32", [4, 3])}, "next_obs"),
    ],
)
def test_hostile_key_layouts_are_refused(change: dict[int, tuple[str, str, list[int]]], said: str) -> None:
    arrays = list(GOOD)
    for i, replacement in change.items():
        arrays[i] = replacement
    if said == "next_obs":  # a plain next_obs where the run has records: the keyed one dropped
        del arrays[5]
    assert load_samples(hand_made(GOOD), keyed_spec()).batch.size == 4
    with pytest.raises(WireError, match=re.escape(said)):
        load_samples(hand_made(arrays), keyed_spec())


def test_a_plain_run_refuses_keyed_messages_and_a_keyed_run_plain_ones() -> None:
    plain = SampleSpec(
        obs_shape=(3,), obs_dtype="float32", action_shape=(), action_dtype="int64", num_actions=4
    )
    with pytest.raises(WireError, match="obs is"):
        load_samples(wire.dump(SamplesMsg(1, 0, 0, transitions(), [])), plain)
    rows = TransitionBatch(
        np.zeros((4, 3), np.float32),
        np.zeros(4, np.int64),
        np.zeros(4, np.float32),
        np.zeros((4, 3), np.float32),
        np.zeros(4, np.float32),
    )
    with pytest.raises(WireError, match="obs is"):
        load_samples(wire.dump(SamplesMsg(1, 0, 0, rows, [])), keyed_spec())


# ------------------------------------------------------------------------------ actor, replay, snapshots


def test_the_actor_s_nstep_log_makes_record_transitions() -> None:
    spec = keyed_spec()
    log = NStepLog(2, 3, 0.9, 4, spec.obs_np_dtype, "int64")
    obs = observations(2)
    for t in range(4):
        nxt = observations(2, seed=t + 1)
        log.add(
            obs, np.zeros(2, np.int64), np.ones(2, np.float32), np.zeros(2, bool), np.zeros(2, bool), nxt, 0
        )
        obs = nxt
    batch, _ = log.take()
    assert batch.obs.dtype == spec.obs_np_dtype and batch.size >= 2
    np.testing.assert_array_equal(batch.obs[0], observations(2)[0])  # the first step's record, whole


@pytest.mark.parametrize("prioritized", [False, True])
def test_replay_stores_and_samples_records(prioritized: bool) -> None:
    replay = make_replay(ReplayConfig(capacity=16, prioritized=prioritized), keyed_spec(), seed=0)
    batch = transitions(10)
    replay.add(batch)
    drawn = replay.sample(32, 0).batch
    assert isinstance(drawn, TransitionBatch) and drawn.obs.dtype == keyed_spec().obs_np_dtype

    def rows(obs: np.ndarray) -> set[bytes]:  # each record's values (not the padding between keys)
        return {obs["image"][i].tobytes() + obs["state"][i].tobytes() for i in range(len(obs))}

    assert rows(drawn.obs) <= rows(batch.obs)  # whole records, never a mix of rows


def test_shared_frames_keep_the_image_key_in_a_pool_and_give_back_whole_records() -> None:
    """tests/test_frames_keyed.py has the rest: sharing, priorities, transactions, the footprint."""
    replay = make_replay(ReplayConfig(capacity=16, share_frames=True), keyed_spec(), seed=0)
    batch = transitions(6)
    replay.add(batch)
    stored = replay.snapshot()
    for key in ("image", "state"):
        np.testing.assert_array_equal(stored.obs[key], batch.obs[key])
        np.testing.assert_array_equal(stored.next_obs[key], batch.next_obs[key])
    assert replay.stats()["live_planes"] <= 2 * 6 * 2  # the image key's planes, at most each once


def test_a_replay_snapshot_stores_one_array_per_key_and_reads_back_checked(tmp_path: Path) -> None:
    spec, path = keyed_spec(), tmp_path / "replay.npz"
    batch = transitions(6)
    write_replay_snapshot(path, batch, updates=7, total_added=6)
    with np.load(path) as data:
        assert {"obs.image", "obs.state", "next_obs.image", "next_obs.state"} <= set(data.files)
    rows, total = read_replay_snapshot(path, 7, spec)
    assert total == 6
    for a, b in zip(rows, batch, strict=True):
        np.testing.assert_array_equal(a, b)
    bad = batch.obs.copy()
    bad["state"][2, 0] = 9.0  # outside its key's bounds: a file is as untrusted as a peer
    write_replay_snapshot(path, batch._replace(obs=bad), updates=7, total_added=6)
    with pytest.raises(SnapshotUnfit, match=r"obs\.state"):
        read_replay_snapshot(path, 7, spec)
    other = (ENTRIES[0], ObsEntry("speed", (3,), "float32"))
    write_replay_snapshot(path, batch, updates=7, total_added=6)
    with pytest.raises(SnapshotUnfit, match="unreadable"):
        read_replay_snapshot(path, 7, keyed_spec(obs_entries=other))


# ------------------------------------------------------------------------------ whole runs


def grid_goal(config: str, run_dir: Path, **values: object) -> list[str]:
    """Overrides that shrink a shipped GridGoal config to a few seconds' run in ``run_dir``."""
    settings: dict[str, object] = {
        "run.dir": str(run_dir),
        "run.name": "t",
        "learner.eval_episodes": 4,
        "learner.progress_seconds": 1.0,
        "learner.checkpoint_interval": 1000,
        **values,
    }
    return [f"{key}={value}" for key, value in settings.items()]


@pytest.mark.parametrize(
    ("config", "values"),
    [
        (
            "grid_goal_dqn.yaml",
            {"learner.max_updates": 120, "learner.min_replay_size": 200, "replay.prioritized": "true"},
        ),
        (
            "grid_goal_dqn.yaml",
            {"learner.max_updates": 120, "learner.min_replay_size": 200, "replay.share_frames": "true"},
        ),
        ("grid_goal_appo.yaml", {"learner.max_updates": 6, "learner.eval_interval": 3}),
        ("grid_goal_appo.yaml", {"learner.max_updates": 6, "learner.eval_interval": 3, "agent.core": "lstm"}),
        (
            "cartpole_novel_r2d2.yaml",
            {
                "env.id": "zmqrl/GridGoal-v0",
                "agent.hidden_sizes": "[32]",
                "agent.core_size": 16,
                "agent.sequence_length": 4,
                "agent.burn_in": 2,
                "learner.max_updates": 20,
                "learner.min_replay_size": 40,
                "learner.eval_interval": 10,
            },
        ),
    ],
    ids=["dqn-prioritized", "dqn-shared-frames", "appo", "appo-lstm", "r2d2"],
)
def test_a_serial_run_trains_on_dict_observations_with_no_bad_message(
    tmp_path: Path, config: str, values: dict[str, object]
) -> None:
    from zmqrl.config import load_config
    from zmqrl.serial import run_serial

    cfg = load_config(REPO / "configs" / config, grid_goal(config, tmp_path, **values))
    stats = run_serial(cfg)["learner"]
    assert stats["state"] == "finished" and stats["updates"] == values["learner.max_updates"]
    assert stats["bad_messages"] == 0 and stats["nonfinite_updates"] == 0 and stats["evaluations"] >= 1


@pytest.mark.slow
def test_a_launched_appo_run_on_dict_observations_takes_every_message(run_root: Path) -> None:
    """Real processes: the intake process gets the spec's entries, forwards records, and the rollouts
    messages (nine arrays: obs and final_obs split by key) fit the samples channel."""
    overrides = grid_goal(
        "grid_goal_appo.yaml", run_root, **{"learner.max_updates": 6, "learner.eval_interval": 3}
    )
    result = launch_to_the_end(REPO / "configs" / "grid_goal_appo.yaml", overrides)
    assert result.returncode == 0, result.stdout + result.stderr
    learner = json.loads((run_root / "t" / "learner-stats.json").read_text())
    assert learner["updates"] == 6 and learner["bad_messages"] == 0
