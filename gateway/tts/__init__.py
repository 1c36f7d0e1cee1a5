"""The gateway's text-to-speech core, shared by every face: the checked request (``request``), the path
from admission to PCM (``synthesis``) and the clocks of a streamed-text call (``stream_watch``)."""
