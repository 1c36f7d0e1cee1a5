"""G.711 mu-law and A-law as lookup tables over numpy arrays.

Encoding indexes a 65,536-entry table with the 16-bit sample (offset by 32,768); decoding indexes a
256-entry table with the byte. Both tables are built once from the reference formulas (ITU-T G.711, the
classic Sun/CCITT implementation that Python's ``audioop`` also follows), so an encode or decode of a
whole chunk is one numpy gather, cheap enough for every 20 ms telephony packet of every session.
"""

from __future__ import annotations

import numpy as np


def _mulaw_encode(s16: np.ndarray) -> np.ndarray:
    # The 14-bit formulation (bias 33, clip 8159); the floor shift of negative samples is part of the
    # reference behaviour, so keep it.
    v = s16.astype(np.int32) >> 2
    mask = np.where(v < 0, 0x7F, 0xFF)
    mag = np.minimum(np.abs(v), 8159) + 33
    seg = np.floor(np.log2(mag)).astype(np.int32) - 5
    # Full scale lands one segment past the last (mag 8192): the reference saturates it to the top code.
    uval = np.where(seg > 7, 0x7F, (seg << 4) | ((mag >> (seg + 1)) & 0x0F))
    return ((uval ^ mask) & 0xFF).astype(np.uint8)


def _alaw_encode(s16: np.ndarray) -> np.ndarray:
    s = s16.astype(np.int32) >> 3  # 13-bit linear
    sign = np.where(s >= 0, 0x80, 0)
    mag = np.minimum(np.where(s >= 0, s, -s - 1), 0xFFF)
    exponent = np.where(mag < 32, 0, np.floor(np.log2(np.maximum(mag, 1))).astype(np.int32) - 4)
    mantissa = np.where(exponent == 0, mag >> 1, mag >> exponent) & 0x0F
    return (((sign | (exponent << 4) | mantissa) ^ 0x55) & 0xFF).astype(np.uint8)


def _mulaw_decode(codes: np.ndarray) -> np.ndarray:
    u = ~codes.astype(np.int32) & 0xFF
    exponent = (u >> 4) & 0x07
    magnitude = (((u & 0x0F) << 3) + 0x84) << exponent
    return np.where(u & 0x80, 0x84 - magnitude, magnitude - 0x84).astype(np.int16)


def _alaw_decode(codes: np.ndarray) -> np.ndarray:
    a = codes.astype(np.int32) ^ 0x55
    exponent = (a >> 4) & 0x07
    mantissa = (a & 0x0F) << 4
    magnitude = np.where(exponent == 0, mantissa + 8, (mantissa + 0x108) << np.maximum(exponent - 1, 0))
    return np.where(a & 0x80, magnitude, -magnitude).astype(np.int16)


_ALL_S16 = np.arange(-32768, 32768, dtype=np.int32)
_ALL_CODES = np.arange(256, dtype=np.int32)
MULAW_ENCODE: np.ndarray = _mulaw_encode(_ALL_S16)  # uint8[65536], index: sample + 32768
ALAW_ENCODE: np.ndarray = _alaw_encode(_ALL_S16)
MULAW_DECODE: np.ndarray = _mulaw_decode(_ALL_CODES)  # int16[256], index: the code byte
ALAW_DECODE: np.ndarray = _alaw_decode(_ALL_CODES)
for _table in (MULAW_ENCODE, ALAW_ENCODE, MULAW_DECODE, ALAW_DECODE):
    _table.setflags(write=False)


def encode_mulaw(s16: np.ndarray) -> bytes:
    return MULAW_ENCODE[s16.astype(np.int32) + 32768].tobytes()


def encode_alaw(s16: np.ndarray) -> bytes:
    return ALAW_ENCODE[s16.astype(np.int32) + 32768].tobytes()


def decode_mulaw(data: bytes) -> np.ndarray:
    """int16 samples of mu-law bytes."""
    return MULAW_DECODE[np.frombuffer(data, dtype=np.uint8)]


def decode_alaw(data: bytes) -> np.ndarray:
    """int16 samples of A-law bytes."""
    return ALAW_DECODE[np.frombuffer(data, dtype=np.uint8)]
