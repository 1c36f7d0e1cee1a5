"""Inter-stage transport helpers: the same-host shared-memory fast path and its wire mapping.

``shm`` and ``host`` import neither grpc nor prometheus (the engines and the metrics module use them);
``payload`` maps them onto the generated ``voxstage.internal.v1`` messages.
"""
