"""The stage runtime shared by the talker and the codec: one process per stage (``process``: deploy file,
device, gRPC server, health, drain), its engine thread (``engine_loop``), the bridge from async handlers to
that thread (``worker``), the gRPC service base (``servicer``), the per-call stream protocol (``stream``) and
opt-in profiler windows for timelines (``torch_profile``: armed by ``process``, run by the engine thread).

Imports point one way: ``servicer`` → ``stream``, ``worker`` → ``engine_loop`` → ``torch_profile``;
``process`` imports none of them but ``torch_profile`` (a stage's ``build`` wires its parts). A stage
(``services.talker``, ``services.codec``) subclasses these; nothing here imports a stage.
"""
