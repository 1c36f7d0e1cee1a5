"""The talker's full-duplex room (docs/protocol.md §11): the session engine (``engine``), its thread and
bridge to the event loop (``worker``) and the per-call protocol state (``stream``). Text-to-speech lives one
folder up; both modes share the stage runtime (``voxstage.stage``).
"""
