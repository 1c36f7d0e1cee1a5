"""Audio8-TTS-Preview-0.6b codec (``codec.pth``, model_type ``arktts``): 44.1 kHz, 2048 samples per frame,
10 codebooks (1 semantic x 4096 + 9 residual x 1024). See ``codec.py`` for the structure."""
