"""ITU-R BS.1770-4 integrated loudness and loudness normalisation of mono PCM, in numpy.

PersonaPlex normalises a voice-prompt WAV to -24 LUFS before Mimi encodes it; the reference uses
``pyloudnorm``. This module reproduces that measurement without scipy or pyloudnorm:

* K-weighting at the signal's own rate, a high shelf then a high-pass, in one of two designs:
  ``"pyloudnorm"`` (default: what the PersonaPlex reference measures with) uses the Audio EQ Cookbook
  formulas for a +4 dB shelf at 1500 Hz (Q 1/sqrt 2) and a unity-gain 38 Hz high-pass (Q 0.5);
  ``"bs1770"`` derives the coefficients from the analog prototype fitted to the standard's 48 kHz table
  (libebur128's constants), which it reproduces to machine precision. The high-pass numerator differs:
  the standard's is ``[1, -2, 1]``, the cookbook's is normalised to unity passband gain, so the cookbook
  design reads 0.043 dB lower (a 997 Hz full-scale sine at 48 kHz: -3.05 instead of -3.01 LUFS; both are
  inside the EBU Tech 3341 tolerance of 0.1 LU);
* mean square over 400 ms blocks with 75 % overlap (``round((duration - 0.4) / 0.1) + 1`` blocks, block j
  on samples ``[int(0.4 * 0.25 j * rate), int(0.4 * (0.25 j + 1) * rate))``, each divided by the full block
  length, as pyloudnorm counts them);
* absolute gate -70 LKFS, relative gate 10 LU below the absolutely gated mean, loudness
  ``-0.691 + 10 log10(mean square)``.

The biquads run exactly (float64, zero initial state, like ``lfilter``) but block-wise: within a block the
response is one matrix product with the filter's impulse response, and only the 2-sample recursive state is
carried from block to block in a short Python loop (N / 256 iterations).

Silence rule: a signal shorter than one 400 ms block, or with no block above the absolute gate, has
loudness ``-inf``; :func:`normalize_loudness` then returns the input unchanged (no gain can reach a target
from silence, and an infinite gain would produce inf/NaN).
"""

from __future__ import annotations

import math

import numpy as np

BLOCK_SECONDS = 0.4
OVERLAP = 0.75
ABSOLUTE_GATE_LKFS = -70.0
RELATIVE_GATE_LU = -10.0
_BLOCK = 256  # biquad block length: work ~ N * _BLOCK flops, Python iterations ~ N / _BLOCK


def _high_shelf(rate: float, gain_db: float, q: float, fc: float) -> tuple[np.ndarray, np.ndarray]:
    a = 10.0 ** (gain_db / 40.0)
    w0 = 2.0 * math.pi * fc / rate
    cs, alpha = math.cos(w0), math.sin(w0) / (2.0 * q)
    sq = 2.0 * math.sqrt(a) * alpha
    b = [
        a * ((a + 1) + (a - 1) * cs + sq),
        -2 * a * ((a - 1) + (a + 1) * cs),
        a * ((a + 1) + (a - 1) * cs - sq),
    ]
    den = [(a + 1) - (a - 1) * cs + sq, 2 * ((a - 1) - (a + 1) * cs), (a + 1) - (a - 1) * cs - sq]
    return np.array(b) / den[0], np.array(den) / den[0]


def _high_pass(rate: float, q: float, fc: float) -> tuple[np.ndarray, np.ndarray]:
    w0 = 2.0 * math.pi * fc / rate
    cs, alpha = math.cos(w0), math.sin(w0) / (2.0 * q)
    b = [(1 + cs) / 2, -(1 + cs), (1 + cs) / 2]
    den = [1 + alpha, -2 * cs, 1 - alpha]
    return np.array(b) / den[0], np.array(den) / den[0]


def _bs1770(rate: float) -> list[tuple[np.ndarray, np.ndarray]]:
    # Analog prototype of the standard's 48 kHz filters (libebur128), re-discretised at ``rate``.
    k = math.tan(math.pi * 1681.974450955533 / rate)
    q = 0.7071752369554196
    vh = 10.0 ** (3.999843853973347 / 20.0)
    vb = vh**0.4996667741545416
    den = 1.0 + k / q + k * k
    shelf_b = np.array([vh + vb * k / q + k * k, 2.0 * (k * k - vh), vh - vb * k / q + k * k]) / den
    shelf_a = np.array([den, 2.0 * (k * k - 1.0), 1.0 - k / q + k * k]) / den
    k = math.tan(math.pi * 38.13547087602444 / rate)
    q = 0.5003270373238773
    den = 1.0 + k / q + k * k
    hp_a = np.array([den, 2.0 * (k * k - 1.0), 1.0 - k / q + k * k]) / den
    return [(shelf_b, shelf_a), (np.array([1.0, -2.0, 1.0]), hp_a)]


DESIGNS = ("pyloudnorm", "bs1770")


def k_weighting(sample_rate: float, design: str = "pyloudnorm") -> list[tuple[np.ndarray, np.ndarray]]:
    """The two K-weighting stages ``[(b, a), (b, a)]`` at ``sample_rate``, normalised so ``a[0] == 1``."""
    if design == "bs1770":
        return _bs1770(sample_rate)
    if design != "pyloudnorm":
        raise ValueError(f"design must be one of {DESIGNS}, got {design!r}")
    return [_high_shelf(sample_rate, 4.0, 1.0 / math.sqrt(2.0), 1500.0), _high_pass(sample_rate, 0.5, 38.0)]


def biquad(x: np.ndarray, b: np.ndarray, a: np.ndarray) -> np.ndarray:
    """``y[n] = b0 x[n] + b1 x[n-1] + b2 x[n-2] - a1 y[n-1] - a2 y[n-2]`` from rest (float64)."""
    x = np.asarray(x, dtype=np.float64)
    n = x.shape[0]
    if n == 0:
        return x.copy()
    w = np.convolve(x, b)[:n]  # the feed-forward part is a plain FIR
    a1, a2 = float(a[1]), float(a[2])
    # g: impulse response of 1 / (1 + a1 z^-1 + a2 z^-2) over one block (+1 sample for the state terms).
    g = np.zeros(_BLOCK + 1)
    g[0], g[1] = 1.0, -a1
    for i in range(2, _BLOCK + 1):
        g[i] = -a1 * g[i - 1] - a2 * g[i - 2]
    idx = np.arange(_BLOCK)
    lower = idx[:, None] - idx[None, :]
    toeplitz = np.where(lower >= 0, g[np.clip(lower, 0, None)], 0.0)
    blocks = -(-n // _BLOCK)
    padded = np.zeros(blocks * _BLOCK)
    padded[:n] = w
    # Zero-state response of every block at once; the carried state adds y[-1] * g[1:] - a2 y[-2] * g[:-1].
    zero_state = padded.reshape(blocks, _BLOCK) @ toeplitz.T
    last, before = zero_state[:, -1], zero_state[:, -2]
    g_last, g_prev, g_prev2 = g[_BLOCK], g[_BLOCK - 1], g[_BLOCK - 2]
    y1 = np.zeros(blocks)  # y[-1] entering each block
    y2 = np.zeros(blocks)  # y[-2] entering each block
    p1 = p2 = 0.0
    for k in range(blocks):
        y1[k], y2[k] = p1, p2
        p1, p2 = (
            last[k] + p1 * g_last - a2 * p2 * g_prev,
            before[k] + p1 * g_prev - a2 * p2 * g_prev2,
        )
    y = zero_state + y1[:, None] * g[1:] - a2 * y2[:, None] * g[:-1]
    return y.reshape(-1)[:n]


def _mono(pcm: np.ndarray) -> np.ndarray:
    x = np.asarray(pcm)
    if x.ndim == 2 and x.shape[0] == 1:
        x = x[0]
    if x.ndim != 1:
        raise ValueError(f"pcm must be mono, shape [samples] or [1, samples], got {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"pcm must be floating point, got {x.dtype}")
    return x


def integrated_loudness(pcm: np.ndarray, sample_rate: float, *, design: str = "pyloudnorm") -> float:
    """Gated integrated loudness of mono ``pcm`` in LUFS; ``-inf`` for silence or < 400 ms of audio."""
    if sample_rate <= 0:
        raise ValueError(f"sample_rate must be > 0, got {sample_rate}")
    filters = k_weighting(sample_rate, design)
    x = _mono(pcm).astype(np.float64)
    if not np.all(np.isfinite(x)):
        raise ValueError("pcm holds inf or NaN samples")
    duration = x.shape[0] / sample_rate
    if duration < BLOCK_SECONDS:
        return -math.inf
    for b, a in filters:
        x = biquad(x, b, a)
    step = 1.0 - OVERLAP
    count = int(round((duration - BLOCK_SECONDS) / (BLOCK_SECONDS * step))) + 1
    j = np.arange(count, dtype=np.float64)
    lo = (BLOCK_SECONDS * (j * step) * sample_rate).astype(np.int64)
    hi = np.minimum((BLOCK_SECONDS * (j * step + 1) * sample_rate).astype(np.int64), x.shape[0])
    energy = np.concatenate([[0.0], np.cumsum(x * x)])
    z = (energy[hi] - energy[lo]) / (BLOCK_SECONDS * sample_rate)
    with np.errstate(divide="ignore"):
        block_lufs = -0.691 + 10.0 * np.log10(z)
    gated = block_lufs > ABSOLUTE_GATE_LKFS
    if not gated.any():
        return -math.inf
    relative = -0.691 + 10.0 * math.log10(float(z[gated].mean())) + RELATIVE_GATE_LU
    gated &= block_lufs > relative
    return -0.691 + 10.0 * math.log10(float(z[gated].mean()))


def normalize_loudness(
    pcm: np.ndarray, sample_rate: float, target_lufs: float = -24.0, *, design: str = "pyloudnorm"
) -> np.ndarray:
    """``pcm`` scaled to ``target_lufs`` integrated loudness (same shape and dtype; may exceed [-1, 1],
    like pyloudnorm, which only warns). Silence / < 400 ms of audio is returned unchanged (a copy)."""
    x = np.asarray(pcm)
    loudness = integrated_loudness(x, sample_rate, design=design)
    if not math.isfinite(loudness):
        return x.copy()
    gain = 10.0 ** ((target_lufs - loudness) / 20.0)
    return (x.astype(np.float64) * gain).astype(x.dtype)
