"""Internal stage API ``voxstage.internal.v1``.

Code generated from protos/voxstage/internal/v1 by scripts/gen_protos.py; edit the .proto, never the output.
"""
