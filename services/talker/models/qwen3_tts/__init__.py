"""Qwen3-TTS talker: Qwen3 backbone, code predictor, prompt construction and the per-frame loop."""
