"""The WebSocket face ``/v1/realtime``: OpenAI Realtime GA events (``events``) over one full-duplex session
(``ws``). It translates events; the session itself is the gateway's core (``gateway.duplex``)."""
