"""Talker stage: autoregressive LMs that turn text (and user codes) into codec frames."""
