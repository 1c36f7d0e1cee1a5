"""Qwen3-TTS 12 Hz tokenizer: decoder (code2wav), encoder and speaker encoder."""
