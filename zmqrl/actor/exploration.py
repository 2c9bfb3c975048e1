"""Exploration schedules: the Ape-X per-actor epsilon ladder and a linear annealing schedule.

Ape-X gives each actor a fixed epsilon instead of annealing one shared value: a spread from
mostly-random to nearly-greedy actors keeps both broad coverage and on-policy-ish data in replay
for the whole run, with no schedule to tune against the run length.
"""

from __future__ import annotations

# Defaults from the Ape-X paper (Horgan et al., 2018): eps_i = 0.4 ** (1 + 7 * i / (N - 1)).
APEX_BASE_EPSILON = 0.4
APEX_ALPHA = 7.0


def apex_epsilon(
    index: int, num_actors: int, base: float = APEX_BASE_EPSILON, alpha: float = APEX_ALPHA
) -> float:
    """Epsilon of actor ``index`` among ``num_actors``: ``base ** (1 + alpha * i / (N - 1))``.

    Actor 0 gets ``base`` (most exploratory), actor N-1 gets ``base ** (1 + alpha)`` (nearly
    greedy). A single actor gets ``base``: the ladder formula is undefined for N = 1, and the
    most exploratory rung is the safer choice for an actor that must explore alone.
    """
    if num_actors < 1:
        raise ValueError(f"num_actors must be >= 1, got {num_actors}")
    if not 0 <= index < num_actors:
        raise ValueError(f"index must be in [0, {num_actors}), got {index}")
    if not 0.0 <= base <= 1.0:
        raise ValueError(f"base must be in [0, 1], got {base}")
    if alpha < 0.0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    if num_actors == 1:
        return float(base)
    return float(base ** (1.0 + alpha * index / (num_actors - 1)))


class LinearSchedule:
    """A value moving linearly from ``start`` to ``end`` over ``duration`` steps, then held.

    Clamped on both sides: ``t <= 0`` gives ``start`` and ``t >= duration`` gives ``end``, so a
    caller can pass a raw step counter. ``duration == 0`` means "already at ``end``".
    """

    def __init__(self, start: float, end: float, duration: int) -> None:
        if duration < 0:
            raise ValueError(f"duration must be >= 0, got {duration}")
        self.start = float(start)
        self.end = float(end)
        self.duration = duration

    def __call__(self, t: float) -> float:
        if self.duration == 0 or t >= self.duration:
            return self.end
        if t <= 0:
            return self.start
        return self.start + (self.end - self.start) * (t / self.duration)

    def __repr__(self) -> str:
        return f"LinearSchedule(start={self.start}, end={self.end}, duration={self.duration})"
