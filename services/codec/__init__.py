"""Codec stage: streaming code2wav decoders and PCM-to-codes encoders."""
