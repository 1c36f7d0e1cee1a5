"""The gateway's full-duplex core, shared by ``/v1/realtime`` and ``Converse``: session admission
(``sessions``), one session whatever carries it (``session``), its settings (``settings``), its codec stream
(``upstream``) and the bound on a client that stops reading (``send``)."""
