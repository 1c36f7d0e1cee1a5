"""BS.1770-4 integrated loudness and -24 LUFS normalisation (PersonaPlex voice prompts)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from services.codec.models.mimi.loudness import (
    biquad,
    integrated_loudness,
    k_weighting,
    normalize_loudness,
)

# ITU-R BS.1770-4 Table 1 / Table 2: the K-weighting coefficients at 48 kHz.
SHELF_48K = (
    [1.53512485958697, -2.69169618940638, 1.19839281085285],
    [1.0, -1.69065929318241, 0.73248077421585],
)
HIGHPASS_48K = ([1.0, -2.0, 1.0], [1.0, -1.99004745483398, 0.99007225036621])


def _sine(freq: float, dbfs: float, seconds: float, rate: int) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    return 10 ** (dbfs / 20) * np.sin(2 * np.pi * freq * t)


def _speechlike(rate: int, seconds: float, seed: int) -> np.ndarray:
    """Noise bursts of varying level separated by silences: both gates have work to do."""
    rng = np.random.default_rng(seed)
    out = np.zeros(int(seconds * rate))
    pos = 0
    while pos < out.size:
        burst = int(rng.uniform(0.2, 0.9) * rate)
        level = 10 ** (rng.uniform(-35, -8) / 20)
        seg = rng.standard_normal(min(burst, out.size - pos)) * level
        out[pos : pos + seg.size] = np.convolve(seg, np.ones(4) / 4, mode="same")
        pos += burst + int(rng.uniform(0.1, 0.6) * rate)
    return out


def test_bs1770_coefficients_at_48k() -> None:
    (shelf_b, shelf_a), (hp_b, hp_a) = k_weighting(48000, "bs1770")
    np.testing.assert_allclose(shelf_b, SHELF_48K[0], atol=1e-12)
    np.testing.assert_allclose(shelf_a, SHELF_48K[1], atol=1e-12)
    np.testing.assert_allclose(hp_b, HIGHPASS_48K[0], atol=1e-12)
    np.testing.assert_allclose(hp_a, HIGHPASS_48K[1], atol=1e-12)
    # The cookbook (pyloudnorm) design is close to the table but not equal to it.
    (p_shelf_b, _), (p_hp_b, p_hp_a) = k_weighting(48000)
    assert np.abs(p_shelf_b - SHELF_48K[0]).max() < 1e-3 and np.abs(p_hp_a - HIGHPASS_48K[1]).max() < 1e-3
    assert abs(p_hp_b[0] - 1.0) > 1e-3


@pytest.mark.parametrize("rate", [24000, 48000])
def test_biquad_equals_the_direct_recursion(rate: int) -> None:
    x = np.random.default_rng(1).standard_normal(1500)
    for b, a in k_weighting(rate) + k_weighting(rate, "bs1770"):
        y = biquad(x, b, a)
        ref = np.zeros_like(x)
        x1 = x2 = y1 = y2 = 0.0
        for n, xn in enumerate(x):
            ref[n] = b[0] * xn + b[1] * x1 + b[2] * x2 - a[1] * y1 - a[2] * y2
            x1, x2, y1, y2 = xn, x1, ref[n], y1
        assert np.abs(y - ref).max() <= 1e-9 * np.abs(ref).max()


@pytest.mark.parametrize(("dbfs", "expected"), [(0.0, -3.01), (-20.0, -23.01)])
def test_997hz_sine_at_48k(dbfs: float, expected: float) -> None:
    """BS.1770-4: a 0 dBFS 997 Hz sine reads -3.01 LKFS (to 0.01 with the standard's filter). The cookbook
    design pyloudnorm uses reads 0.043 dB lower (its high-pass has unity passband gain, the standard's
    0.995) and stays inside the EBU Tech 3341 tolerance of 0.1 LU."""
    sine = _sine(997.0, dbfs, 3.0, 48000)
    standard = integrated_loudness(sine, 48000, design="bs1770")
    cookbook = integrated_loudness(sine, 48000)
    assert abs(standard - expected) < 0.01
    assert abs(cookbook - expected) < 0.1
    assert 0.03 < standard - cookbook < 0.06


@pytest.mark.parametrize(("rate", "target"), [(24000, -24.0), (24000, -16.0), (44100, -24.0)])
def test_normalisation_hits_the_target(rate: int, target: float) -> None:
    pcm = _speechlike(rate, 6.0, seed=rate).astype(np.float32)
    before = integrated_loudness(pcm, rate)
    out = normalize_loudness(pcm, rate, target)
    assert out.dtype == np.float32 and out.shape == pcm.shape
    assert abs(before - target) > 2  # the test signal starts far from the target
    assert abs(integrated_loudness(out, rate) - target) < 0.1
    # Loudness is linear in gain: the output is the input times one scalar.
    gain = out[np.abs(pcm) > 1e-3] / pcm[np.abs(pcm) > 1e-3]
    assert np.allclose(gain, gain[0], rtol=1e-5)
    shaped = normalize_loudness(pcm[None], rate, target)
    assert shaped.shape == (1, pcm.size) and np.array_equal(shaped[0], out)


def test_gating_ignores_silence() -> None:
    rate = 24000
    tone = _sine(440.0, -12.0, 4.0, rate)
    padded = np.concatenate([tone, np.zeros(4 * rate)])
    # Half the blocks are silent: ungated, the mean square would drop by 3 dB.
    assert abs(integrated_loudness(padded, rate) - integrated_loudness(tone, rate)) < 0.2
    # A quiet passage 20 dB down is below the relative gate (-10 LU) and is ignored too.
    quiet = np.concatenate([tone, _sine(440.0, -32.0, 4.0, rate)])
    assert abs(integrated_loudness(quiet, rate) - integrated_loudness(tone, rate)) < 0.2


def test_silence_and_short_input_come_back_unchanged() -> None:
    rate = 24000
    for pcm in (np.zeros(rate, np.float32), _sine(440, -85.0, 1.0, rate), _sine(440, -6.0, 0.3, rate)):
        assert integrated_loudness(pcm, rate) == -math.inf
        out = normalize_loudness(pcm, rate)
        assert np.array_equal(out, pcm) and out is not pcm and np.all(np.isfinite(out))


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="mono"):
        integrated_loudness(np.zeros((2, 48000)), 48000)
    with pytest.raises(ValueError, match="floating point"):
        integrated_loudness(np.zeros(48000, np.int16), 48000)
    with pytest.raises(ValueError, match="inf or NaN"):
        integrated_loudness(np.full(48000, np.nan), 48000)
    with pytest.raises(ValueError, match="sample_rate"):
        integrated_loudness(np.zeros(48000), 0)
    with pytest.raises(ValueError, match="design"):
        normalize_loudness(np.zeros(48000), 48000, design="ebu")
