"""The codec's full-duplex room (docs/protocol.md §11): the 80 ms clock and its engine (``engine``, batched
calls in ``calls`` / ``graphs``), voice recordings (``reference``), the worker bridge (``worker``), and the
per-call protocol state (``open``, ``stream``, ``relay`` to the talker). Text-to-speech lives one folder up.
"""
