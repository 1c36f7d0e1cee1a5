"""voxstage: streaming speech models served as gRPC microservices (talker, codec, gateway)."""

__version__ = "0.1.0"
