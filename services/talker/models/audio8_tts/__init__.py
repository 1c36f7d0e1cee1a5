"""Audio8-TTS Preview (``arktts``): Qwen2-shaped slow AR + 10-position fast AR, 10 codebooks per frame."""
