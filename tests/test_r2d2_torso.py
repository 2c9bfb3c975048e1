"""R2D2 with a CNN torso (agent.torso): the table's layout, numpy acting against torch step after
step on frames and on records with an image key, an update on windows of frames, the refusals of
frames too small, the Nature CNN acting through torch, and a short serial MinAtar run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import zmqrl
from tests.test_dict_obs_agents import DISCRETE, records
from zmqrl.agents.builtin import R2D2_PLUGIN, check_r2d2, make_r2d2_policy
from zmqrl.agents.r2d2 import R2D2Agent
from zmqrl.agents.r2d2_config import R2D2Config
from zmqrl.agents.r2d2_policy import NumpyR2D2Policy, r2d2_net
from zmqrl.runtime.run_fingerprint import run_fingerprint
from zmqrl.serial import run_serial
from zmqrl.spec import SampleSpec
from zmqrl.transport.fingerprint import fingerprint_mismatch
from zmqrl.types import SEQUENCE_BURN_IN, SEQUENCE_LEARNED, SequenceBatch

torch.set_num_threads(1)

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
FRAMES = (4, 10, 10)
CORE = 16
LENGTH, BURN_IN = 4, 2
# Float rounding between numpy and torch (different summation orders).
RTOL, ATOL = 1e-5, 1e-5


def frame_spec(shape: tuple[int, ...] = FRAMES) -> SampleSpec:
    """MinAtar-like 0/1 uint8 grids, channels first, as windows of LENGTH + BURN_IN steps."""
    return SampleSpec(
        shape,
        "uint8",
        (),
        "int64",
        num_actions=3,
        obs_low=0.0,
        obs_high=1.0,
        sequence_length=BURN_IN + LENGTH,
        burn_in=BURN_IN,
        core_size=CORE,
    )


def config(torso: str = "minatar_cnn") -> R2D2Config:
    return R2D2Config(
        torso=torso, hidden_sizes=[32], core_size=CORE, sequence_length=LENGTH, burn_in=BURN_IN, device="cpu"
    )


def frames(rng: np.random.Generator, *lead: int, shape: tuple[int, ...] = FRAMES) -> np.ndarray:
    return rng.integers(0, 2, (*lead, *shape), dtype=np.uint8)


def layout_of(module: torch.nn.Module) -> list[tuple[str, tuple[int, ...]]]:
    return [(name, tuple(t.shape)) for name, t in module.state_dict().items()]


# ------------------------------------------------------------------------------- the table


def test_the_state_dict_is_the_tables_layout_and_the_cnn_feeds_the_lstm() -> None:
    """On frames the LSTM reads the CNN's 128 features (no MLP of hidden_sizes after it, as DQN's
    and APPO's heads read them); on records the MLP of hidden_sizes mixes the image key's CNN
    features with the vector key before the LSTM."""
    agent = R2D2Agent(config(), frame_spec(), seed=0)
    layout = r2d2_net(config(), frame_spec()).layout(FRAMES)
    assert layout_of(agent.online) == list(layout.items())
    assert "torso.convs.0.weight" in layout and "torso.0.weight" not in layout
    assert layout["core.weight_ih"] == (4 * CORE, 128)
    keyed = R2D2Agent(config(), DISCRETE, seed=0)
    layout = r2d2_net(config(), DISCRETE).layout(())
    assert layout_of(keyed.online) == list(layout.items())
    assert layout["torso.image.convs.0.weight"] == (16, 2, 3, 3)
    assert layout["torso.0.weight"] == (32, 128 + 3) and layout["core.weight_ih"] == (4 * CORE, 32)


def test_the_seed_alone_draws_the_cnn() -> None:
    """The conv layers come from the seed's generator too, whatever the global RNG did."""
    torch.manual_seed(1)
    first = R2D2Agent(config(), frame_spec(), seed=5).export_weights()
    torch.manual_seed(2)
    second = R2D2Agent(config(), frame_spec(), seed=5).export_weights()
    assert all(np.array_equal(first[name], second[name]) for name in first)


# ------------------------------------------------------------------------------- acting


@pytest.mark.parametrize("spec", [frame_spec(), DISCRETE], ids=["frames", "records"])
def test_numpy_acting_gives_the_torch_q_values_step_after_step(spec: SampleSpec) -> None:
    cfg = config()
    assert check_r2d2(cfg, spec, None) is None
    policy = make_r2d2_policy(cfg, spec, seed=9)
    assert isinstance(policy, NumpyR2D2Policy)  # the MinAtar CNN acts in numpy
    agent = R2D2Agent(cfg, spec, seed=3)
    policy.load_weights(agent.export_weights())
    rng = np.random.default_rng(0)
    for step in range(5):
        obs = frames(rng, 6) if spec is not DISCRETE else records(rng, 6)
        np.testing.assert_allclose(policy.q_values(obs), agent.q_values(obs), rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(policy.core_state(), agent.core_state(), rtol=RTOL, atol=1e-6)
        if step == 2:  # env 4's episode ends: its state starts over on both sides
            done = np.arange(6) == 4
            policy.reset_core(done)
            agent.reset_core(done)
    assert np.abs(policy.core_state()).max() > 0.0  # the state moved: the LSTM was really stepped


def test_the_nature_cnn_acts_through_torch_with_its_state() -> None:
    """numpy would run its convolutions many times slower: the actors' policy is the torch agent on
    the CPU, a recurrent policy all the same."""
    spec = frame_spec((4, 36, 36))
    cfg = config("nature_cnn")
    assert check_r2d2(cfg, spec, None) is None and not r2d2_net(cfg, spec).numpy_acting
    policy = make_r2d2_policy(cfg, spec, seed=0)
    assert isinstance(policy, R2D2Agent) and policy.device == "cpu"
    obs = frames(np.random.default_rng(0), 3, shape=(4, 36, 36))
    assert policy.act(obs, explore=False).shape == (3,)
    assert np.abs(policy.core_state()).max() > 0.0


# ------------------------------------------------------------------------------- learning


def frame_windows(rng: np.random.Generator, rows: int = 3) -> SequenceBatch:
    window = BURN_IN + LENGTH
    mask = np.full((rows, window), SEQUENCE_LEARNED, np.uint8)
    mask[:, :BURN_IN] = SEQUENCE_BURN_IN
    return SequenceBatch(
        frames(rng, rows, window + 1),
        rng.integers(0, 3, (rows, window)),
        rng.normal(size=(rows, window)).astype(np.float32),
        np.zeros((rows, window), bool),
        mask,
        rng.uniform(-0.5, 0.5, (rows, 2, CORE)).astype(np.float32),
    )


def test_an_update_on_windows_of_frames_is_finite_and_moves_the_weights() -> None:
    agent = R2D2Agent(config(), frame_spec(), seed=3)
    before = agent.export_weights()
    result = agent.update(frame_windows(np.random.default_rng(0)))
    assert not result.skipped and all(np.isfinite(value) for value in result.values())
    assert np.isfinite(result.td_errors).all() and result.td_errors.shape == (3,)
    after = agent.export_weights()
    assert not np.array_equal(before["torso.convs.0.weight"], after["torso.convs.0.weight"])


# ------------------------------------------------------------------------------- refusals


def test_a_torso_too_big_for_the_frames_is_refused_with_its_message() -> None:
    cfg = config("nature_cnn")
    problem = check_r2d2(cfg, frame_spec(), None)
    assert problem is not None and "agent.torso 'nature_cnn' needs larger frames than 10x10" in problem
    with pytest.raises(ValueError, match="needs larger frames than 10x10"):
        NumpyR2D2Policy(cfg, frame_spec())
    with pytest.raises(ValueError, match="needs larger frames than 10x10"):
        R2D2Agent(cfg, frame_spec())
    flat = SampleSpec((3,), "float32", (), "int64", num_actions=2)
    problem = check_r2d2(config(), flat, None)
    assert problem is not None and "needs image observations (C, H, W)" in problem
    with pytest.raises(ValueError, match=r"agent\.torso: must be one of"):
        config("resnet").check()


def test_the_torso_is_part_of_the_fingerprint() -> None:
    """Actors must build the learner's acting network: an actor with another torso is refused."""
    assert "torso" in R2D2_PLUGIN.fingerprint_fields
    path = CONFIGS / "cartpole_novel_r2d2.yaml"
    mine = run_fingerprint(zmqrl.load_config(path, ["agent.torso=minatar_cnn"]), frame_spec())
    theirs = run_fingerprint(zmqrl.load_config(path), frame_spec())
    assert fingerprint_mismatch(mine, theirs) == ["agent.torso"]


# ------------------------------------------------------------------------------- a run


def test_a_short_serial_minatar_run_with_the_cnn_finishes_cleanly(tmp_path: Path) -> None:
    pytest.importorskip("minatar")
    overrides = [
        f"run.dir={tmp_path}", "env.id=MinAtar/Breakout-v1", "env.max_episode_steps=200",
        "agent.torso=minatar_cnn", "agent.hidden_sizes=[16]", "agent.core_size=16",
        "agent.sequence_length=4", "agent.burn_in=2", "agent.batch_size=8",
        "learner.max_updates=6", "learner.min_replay_size=40", "learner.eval_interval=3",
        "learner.eval_episodes=1", "learner.checkpoint_interval=1000", "actor.max_steps_per_s=3000",
    ]  # fmt: skip
    cfg = zmqrl.load_config(CONFIGS / "cartpole_novel_r2d2.yaml", overrides)
    stats = run_serial(cfg, run_dir=tmp_path / "run")
    learner = stats["learner"]
    assert learner["bad_messages"] == 0 and learner["updates"] == 6 and learner["evaluations"] >= 1
    policy = zmqrl.load_policy(tmp_path / "run")
    assert policy.recurrent
