"""The HTTP face: OpenAI-compatible ``/v1/audio/speech``, ``/v1/models``, ``/v1/audio/voices``, health and
metrics (``app``), the speech request's body and delivery (``speech``) and the connection limits
(``limits``). It translates; the request path itself is the gateway's core (``gateway.tts``)."""
