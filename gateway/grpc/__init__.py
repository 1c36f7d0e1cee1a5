"""The gRPC face: ``voxstage.v1.Speech`` (``speech``: Synthesize, StreamingSynthesize, ListVoices;
``converse``: the full-duplex Converse) and reflection v1 (``reflection``). It translates protos; the request
paths are the gateway's core (``gateway.tts``, ``gateway.duplex``)."""
