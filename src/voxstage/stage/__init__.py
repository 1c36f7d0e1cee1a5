"""The stage runtime shared by the talker and the codec: one process per stage (``process``: deploy file,
device, gRPC server, health, drain), its engine thread (``engine_loop``), the bridge from async handlers to
that thread (``worker``), the gRPC service base (``servicer``) and the per-call stream protocol (``stream``).

Imports point one way: ``servicer`` → ``stream``, ``worker`` → ``engine_loop``; ``process`` imports none of
them (a stage's ``build`` wires its parts). A stage (``services.talker``, ``services.codec``) subclasses
these; nothing here imports a stage.
"""
