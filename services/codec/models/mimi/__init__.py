"""Mimi (kyutai), the PersonaPlex/Moshi audio codec: 24 kHz mono PCM <-> 8 x 2048 codes at 12.5 Hz.

``model.py`` holds the module tree (kyutai checkpoint names), ``streaming.py`` the exact batched streaming
slot pool (encode and decode directions; packed or slot-indexed rows), ``state.py`` the flat per-stream state
layout the streaming step rewrites in place, ``loader.py`` strict loading and seeded random weights,
``presets.py`` the tiny and released configs, ``loudness.py`` the BS.1770 voice-prompt normalisation.
"""
