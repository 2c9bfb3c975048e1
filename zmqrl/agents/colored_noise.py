"""Temporally correlated ("colored") Gaussian exploration noise for SAC's acting.

White noise, drawn afresh every step, averages out over a few steps: on a task whose reward sits
behind a long consistent push (MountainCarContinuous: rock back, then drive up the hill) the car
jitters in place, never sees the goal, and SAC learns to stand still. Noise whose power spectral
density falls as ``1/f**beta`` keeps the same per-step spread (each step is N(0, 1)) but moves its
power to low frequencies, so the actions it perturbs stay pushed one way for many steps: beta 0 is
white, 1 pink, 2 red (Brownian-like). Eberhard et al. (ICLR 2023) found pink noise a good default
for off-policy continuous control, and enough on its own to solve MountainCarContinuous with SAC.

The noise is generated a sequence of ``horizon`` steps at a time per row (one row per sub-env, each
action dimension its own sequence) by the FFT method of Timmer & König (1995): complex Gaussian
Fourier coefficients scaled by ``f**(-beta/2)`` (the frequencies below ``1/horizon`` held at that
value: the sequence cannot hold anything slower), an inverse real FFT, and a division by the exact
theoretical standard deviation (:func:`sequence_std`), so each step is marginally N(0, 1). All of
it is drawn from the caller's ``np.random.Generator``: a seed reproduces the noise.
"""

from __future__ import annotations

import math

import numpy as np


def spectrum_amplitudes(beta: float, horizon: int) -> np.ndarray:
    """The standard deviation of each Fourier coefficient's real (and imaginary) part, for the
    ``horizon // 2 + 1`` frequencies ``k / horizon`` of ``np.fft.rfft``: ``f**(-beta/2)``, with
    the zero frequency held at the lowest one's value (``1/horizon``, the cutoff).

    The zero-frequency and (even ``horizon``) Nyquist coefficients are real, so their single part
    is drawn with ``sqrt(2)`` times this: every frequency then carries the same power it would as
    a complex coefficient, and the spectrum stays ``f**-beta`` down to the cutoff.
    """
    freqs = np.fft.rfftfreq(horizon)
    freqs[0] = freqs[1]
    return freqs ** (-beta / 2.0)


def sequence_std(beta: float, horizon: int) -> float:
    """The standard deviation of each step of ``irfft`` of the coefficients ``spectrum_amplitudes``
    describes, the same for every step (the series is stationary).

    ``irfft`` gives ``y_t = (X_0 + 2 sum_k Re(X_k e^{2 pi i k t / n}) + X_{n/2} (-1)^t) / n``; an
    interior term with both parts ``N(0, a_k**2)`` has variance ``4 a_k**2`` whatever ``t`` is,
    and a real one drawn as ``sqrt(2) a_k N(0, 1)`` has ``2 a_k**2``.
    """
    amplitudes = spectrum_amplitudes(beta, horizon)
    has_nyquist = horizon % 2 == 0
    interior = amplitudes[1:-1] if has_nyquist else amplitudes[1:]
    variance = 2.0 * amplitudes[0] ** 2 + 4.0 * float(np.sum(interior**2))
    if has_nyquist:
        variance += 2.0 * amplitudes[-1] ** 2
    return math.sqrt(variance) / horizon


def lag_autocorrelation(beta: float, horizon: int, lag: int) -> float:
    """The theoretical correlation of steps ``lag`` apart within a sequence (the Wiener-Khinchin
    sum of the spectrum's power times ``cos(2 pi k lag / n)``): what a test expects to measure."""
    amplitudes = spectrum_amplitudes(beta, horizon)
    power = 4.0 * amplitudes**2
    power[0] /= 2.0
    if horizon % 2 == 0:
        power[-1] /= 2.0
    phases = np.cos(2.0 * np.pi * np.arange(len(power)) * lag / horizon)
    return float(np.sum(power * phases) / np.sum(power))


class ColoredNoise:
    """Unit-variance Gaussian noise of spectrum ``1/f**beta`` for arrays of one shape (SAC's
    ``(B, act_dim)`` mean), one independent sequence per element, advanced one step per call.

    ``beta == 0`` is exactly the white draw SAC has always made, ``rng.standard_normal(shape,
    dtype=float32)`` per call, so results of white-noise runs do not change. Otherwise each call
    returns the next step of the current sequences; when they are used up (every ``horizon`` calls)
    a new block is drawn for every row, and a call with another shape (the batch of sub-envs
    changed) starts new sequences at once. The sequences do not restart with an episode: the actor
    does not tell the policy where episodes end, and a step of one is as good as any other.
    """

    def __init__(self, beta: float, horizon: int) -> None:
        if not 0.0 <= beta <= 2.0:
            raise ValueError(f"noise beta must be in [0, 2], got {beta}")
        if horizon < 2:
            raise ValueError(f"noise horizon must be >= 2, got {horizon}")
        self.beta = float(beta)
        self.horizon = int(horizon)
        self._amplitudes = spectrum_amplitudes(self.beta, self.horizon)
        self._std = sequence_std(self.beta, self.horizon)
        self._block: np.ndarray | None = None  # (horizon, *shape) float32: the sequences, step first
        self._step = 0  # the next step of _block to hand out

    def __call__(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """The next noise step, float32 of ``shape``, drawn from ``rng``."""
        if self.beta == 0.0:
            return rng.standard_normal(shape, dtype=np.float32)
        if self._block is None or self._block.shape[1:] != shape or self._step >= self.horizon:
            self._block = self._draw(rng, shape)
            self._step = 0
        noise = self._block[self._step].copy()  # the caller's to keep or change
        self._step += 1
        return noise

    def _draw(self, rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
        """New sequences for every element of ``shape``: ``(horizon, *shape)`` float32."""
        n_freqs = len(self._amplitudes)
        parts = rng.standard_normal((2, *shape, n_freqs)) * self._amplitudes
        real, imag = parts[0], parts[1]
        # The zero-frequency and (even horizon) Nyquist coefficients of a real series are real.
        real_only = [0, n_freqs - 1] if self.horizon % 2 == 0 else [0]
        real[..., real_only] *= math.sqrt(2.0)
        imag[..., real_only] = 0.0
        series = np.fft.irfft(real + 1j * imag, n=self.horizon, axis=-1) / self._std
        return np.ascontiguousarray(np.moveaxis(series, -1, 0), dtype=np.float32)
