"""README's Results rows: which config each row launches, with which overrides and seeds, against
which target, and how the row describes itself. ``benchmarks/results.py`` runs and renders them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Row:
    name: str
    config: str
    seeds: int
    target: float | None  # None: a row that reports its returns, with no target to reach
    algorithm: str
    sets: tuple[str, ...] = ()
    timeout: float = 1800.0  # seconds; a run past it is stopped and counted as not reaching
    # Env steps at which each run also stores its training return (the mean of the last 100
    # exploring episodes: the MinAtar paper's measure), as ``train_return`` {mark: value}.
    train_at: tuple[int, ...] = ()

    def command(self) -> str:
        sets = "".join(f" --set {s}" for s in self.sets)
        return f"zmqrl launch {self.config}{sets} --set run.seed=S"


# The marks (frames = env steps: MinAtar has no frame skip) a MinAtar row's training return is
# stored at, for the comparison with the paper's curves in docs/results.md.
MINATAR_MARKS = (500_000, 1_000_000, 2_000_000)
MINATAR = "DQN, MinAtar CNN (3×3×16 conv, 128 units), 2 actors, replay ratio 8"
# Young & Tian 2019 (arXiv:1903.03176), DQN's training return (mean of the last 100 episodes, 30
# seeds) read off its learning curves, at the frames (= env steps) a 15-minute run here reaches.
MINATAR_PAPER = {
    "Asterix": "≈ 12 at 1.2M frames, 15 at 2.5M",
    "Breakout": "≈ 9 at 0.5M frames, 10 from 1M",
    "Freeway": "≈ 45 at 0.5M frames, 50 from 1M",
    "Seaquest": "≈ 1 at 1M frames",
    "SpaceInvaders": "≈ 25 at 0.5M frames, 35 at 1M",
}
ROWS = {
    "cartpole": Row(
        "cartpole",
        "configs/cartpole_dqn.yaml",
        20,
        475.0,
        "DQN, prioritized replay, 2 actors, replay ratio 8, 20-episode evals",
    ),
    # The row above's config after `zmqrl tune` (16 trials of configs/tune/cartpole_dqn.yaml).
    "cartpole-tuned": Row(
        "cartpole-tuned",
        "configs/tuned/cartpole_dqn.yaml",
        20,
        475.0,
        "DQN as above, tuned by `zmqrl tune`: n-step 5, target every 21, lr 0.0017, batch 128, ratio 4",
    ),
    "pendulum": Row(
        "pendulum", "configs/pendulum_sac.yaml", 3, -200.0, "SAC, 2 actors, evaluator, replay ratio 128"
    ),
    "cartpole-appo": Row(
        "cartpole-appo",
        "configs/cartpole_appo.yaml",
        20,
        475.0,
        "APPO (V-trace, PPO clip), 1 actor × 8 envs, 32-step rollouts, 256-step batches, 10 epochs",
    ),
    # Issue 40: a task that needs memory. The feed-forward row is there to show it fails.
    "cartpole-novel-lstm": Row(
        "cartpole-novel-lstm",
        "configs/cartpole_novel_lstm_appo.yaml",
        3,
        475.0,
        "APPO with an LSTM core on CartPole without velocities (position and angle only)",
    ),
    "cartpole-novel-r2d2": Row(
        "cartpole-novel-r2d2",
        "configs/cartpole_novel_r2d2.yaml",
        3,
        475.0,
        "R2D2: recurrent DQN on replayed windows (10 burn-in + 20 steps) on the same observations",
    ),
    "cartpole-novel-dqn": Row(
        "cartpole-novel-dqn",
        "configs/cartpole_novel_dqn.yaml",
        3,
        475.0,
        "feed-forward DQN (cartpole_dqn.yaml) on the same observations: no memory, no velocities",
    ),
    "cartpole-novel-appo": Row(
        "cartpole-novel-appo",
        "configs/cartpole_novel_appo.yaml",
        3,
        475.0,
        "feed-forward APPO on the same observations: no memory, no velocities",
    ),
    # Issue 40: a game with illegal moves, its action mask in a Dict observation (the env raises
    # at an illegal move, so a finished run took none). Best return 6; a random legal player 2.45.
    "pick-largest-dqn": Row(
        "pick-largest-dqn",
        "configs/pick_largest_dqn.yaml",
        3,
        5.7,
        "masked DQN on PickLargest (6 slots; illegal moves raise), 2 actors, replay ratio 8",
    ),
    "pick-largest-appo": Row(
        "pick-largest-appo",
        "configs/pick_largest_appo.yaml",
        3,
        5.7,
        "masked APPO on PickLargest (logits of illegal slots masked), 1 actor × 8 envs",
    ),
    "grid-goal-dqn": Row(
        "grid-goal-dqn",
        "configs/grid_goal_dqn.yaml",
        3,
        0.95,
        "DQN on GridGoal's Dict observation (image: MinAtar CNN; goal vector), 2 actors, replay ratio 4",
    ),
    "grid-goal-appo": Row(
        "grid-goal-appo",
        "configs/grid_goal_appo.yaml",
        3,
        0.95,
        "APPO on GridGoal's Dict observation (image: MinAtar CNN; goal vector), 2 actors × 8 envs",
    ),
    "pendulum-appo": Row(
        "pendulum-appo",
        "configs/pendulum_appo.yaml",
        3,
        -200.0,
        "APPO, clipped Gaussian policy, 2 actors × 8 envs, 64-step rollouts",
    ),
    "minatar-breakout-appo": Row(
        "minatar-breakout-appo",
        "configs/minatar_breakout_appo.yaml",
        3,
        10.0,
        "APPO, MinAtar CNN, 2 actors × 16 envs, 64-step rollouts",
        ("learner.max_seconds=300",),
    ),
    # Issue 40: MinAtar Breakout with one frame per observation (the ball's trail channel removed,
    # zmqrl/MinAtarBreakoutNoTrail-v1): recurrent APPO, and the feed-forward config on the same frames.
    # 10 minutes each: a recurrent update costs ~2.5x a feed-forward one on a CPU, and the rows are
    # read by env steps at the target (the recurrent one reaches 10 with fewer, not sooner).
    "minatar-breakout-lstm-appo": Row(
        "minatar-breakout-lstm-appo",
        "configs/minatar_breakout_lstm_appo.yaml",
        3,
        10.0,
        "APPO with an LSTM core (128) after the MinAtar CNN, Breakout without its trail channel",
        ("learner.max_seconds=600",),
    ),
    "minatar-breakout-notrail-appo": Row(
        "minatar-breakout-notrail-appo",
        "configs/minatar_breakout_appo.yaml",
        3,
        10.0,
        "feed-forward APPO (minatar-breakout-appo's config) on the same frames: no trail, no memory",
        ("env.id=zmqrl/MinAtarBreakoutNoTrail-v1", "learner.max_seconds=600"),
    ),
    "minatar-breakout-r2d2": Row(
        "minatar-breakout-r2d2",
        "configs/minatar_breakout_r2d2.yaml",
        3,
        10.0,
        "R2D2 from pixels: MinAtar CNN, LSTM (128), windows of 10 burn-in + 20 steps, 2 actors x 4 envs",
    ),
    "minatar-breakout": Row(
        "minatar-breakout",
        "configs/minatar_breakout_dqn.yaml",
        3,
        10.0,
        f"{MINATAR} (paper's DQN: {MINATAR_PAPER['Breakout']})",
        train_at=MINATAR_MARKS,
    ),
    # The other four MinAtar games with Breakout's config as it is (issue 28: one config, 3 seeds,
    # against the MinAtar paper's DQN at the same number of frames: docs/results.md).
    **{
        f"minatar-{game.lower()}": Row(
            f"minatar-{game.lower()}",
            "configs/minatar_breakout_dqn.yaml",
            3,
            None,
            f"{MINATAR} (paper's DQN: {MINATAR_PAPER[game]})",
            (f"env.id=MinAtar/{game}-v1",),
            train_at=MINATAR_MARKS,
        )
        for game in ("Asterix", "Freeway", "Seaquest", "SpaceInvaders")
    },
    # configs/zoo: one tuned config per task (CartPole's and Pendulum's are the rows above).
    "zoo-acrobot": Row(
        "zoo-acrobot",
        "configs/zoo/acrobot_dqn.yaml",
        3,
        -100.0,
        "DQN, prioritized replay, 2 actors, replay ratio 32 (RL Zoo: −76.6 at 100k steps)",
    ),
    "zoo-mountaincar": Row(
        "zoo-mountaincar",
        "configs/zoo/mountaincar_dqn.yaml",
        3,
        -110.0,
        "DQN, 2 actors, replay ratio 64, lr annealed (RL Zoo: −100.8 at 120k steps)",
    ),
    "zoo-mountaincar-continuous": Row(
        "zoo-mountaincar-continuous",
        "configs/zoo/mountaincar_continuous_sac.yaml",
        3,
        90.0,
        "SAC with pink exploration noise, 2 actors, evaluator, replay ratio 512 (RL Zoo: 94.7 at 50k steps)",
    ),
    # HalfCheetah: 3 seeds of 7 minutes against 3,000 (issue 27's bar for this machine kind).
    "zoo-halfcheetah": Row(
        "zoo-halfcheetah",
        "configs/zoo/halfcheetah_sac.yaml",
        3,
        3000.0,
        "SAC, 2 actors, evaluator, replay ratio 256, 7 minutes (RL Zoo: 9,535 at 1M steps)",
        ("learner.max_seconds=420",),
        timeout=900.0,
    ),
    **{
        f"zoo-{task}": Row(
            f"zoo-{task}",
            f"configs/zoo/{task}_sac.yaml",
            1,
            None,
            f"SAC, 2 actors, evaluator, replay ratio 256, 10 minutes (RL Zoo: {zoo} at 1M steps)",
            ("learner.max_seconds=600",),
            timeout=900.0,
        )
        for task, zoo in (
            ("hopper", "2,326"),
            ("walker2d", "3,863"),
            ("ant", "4,616"),
        )
    },
    "pong": Row(
        "pong",
        "configs/pong_dqn.yaml",
        1,
        None,
        "Ape-X DQN (Nature CNN, PER, shared-frame replay, 4×4 vector actors, evaluator); "
        "not learned on a CPU",
        ("learner.max_seconds=240",),
    ),
}
