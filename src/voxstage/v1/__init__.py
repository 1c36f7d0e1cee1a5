"""Public gRPC API ``voxstage.v1``.

Code generated from protos/voxstage/v1 by scripts/gen_protos.py; edit the .proto, never the output.
"""
