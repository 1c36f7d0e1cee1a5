"""Issue 26's defects, each as a client met it, on the session's real stacks (tests/integration/conftest.py).

Defect 1 (the talker crash) and 2 (memory) are in test_chaos.py with the other limit probes; 5 and 7 are
gateway-internal and tested in tests/unit/gateway (test_cancel_race.py, test_hardening_timeouts_http.py,
test_security_keys.py, test_duplex_realtime.py).
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import socket
import time
import urllib.request
from collections.abc import Iterator

import grpc
import httpx
import numpy as np
import pytest

from tests.integration.servekit import DUPLEX_SEND_TIMEOUT_S, Served
from voxstage.v1 import speech_pb2, speech_pb2_grpc

pytestmark = pytest.mark.timeout(120)


def _access_lines(served: Served) -> int:
    return served.log.read_text(errors="replace").count("voxstage.gateway.access: request")


def test_a_long_name_gets_its_real_status_once_with_a_short_echo(audio8_served: Served) -> None:
    """Defect 3: an 8,000+ character voice, model or language came back as RESOURCE_EXHAUSTED ("received
    metadata size exceeds hard limit", the gateway echoed the whole value), and the SDK retried it three
    times; over HTTP a 1 MB value came back as a 1 MB 404 body."""
    from voxstage.client import SpeechClient, SpeechError

    expected = {"model": grpc.StatusCode.NOT_FOUND, "language": grpc.StatusCode.INVALID_ARGUMENT,
                "voice": grpc.StatusCode.NOT_FOUND}  # fmt: skip
    with SpeechClient(audio8_served.grpc_addr, timeout=30) as client:  # the default retry policy
        for field, code in expected.items():
            before = _access_lines(audio8_served)
            with pytest.raises(SpeechError) as err:
                client.synthesize("hi", **{field: "x" * 9000})
            assert err.value.code is code, err.value
            assert len(err.value.message) < 600 and "(9000 characters)" in err.value.message
            time.sleep(0.2)
            assert _access_lines(audio8_served) - before == 1, "the SDK retried a request that cannot pass"
    body = {"input": "hi", "voice": "v" * 1_000_000}
    r = httpx.post(f"{audio8_served.http_url}/v1/audio/speech", json=body, timeout=30)
    assert r.status_code == 404 and len(r.content) < 2000, (r.status_code, len(r.content))


def _pcm_frame() -> bytes:
    t = np.arange(1920) / 24_000
    return (0.1 * np.sin(2 * np.pi * 220 * t) * 32767).astype("<i2").tobytes()


def test_converse_refuses_an_unknown_audio_encoding_with_an_error_and_goes_on(
    personaplex_served: Served,
) -> None:
    """Defect 4: an unknown AudioEncoding (99) in a session's format ended Converse at once with status OK,
    no error event and no log line."""
    bad = speech_pb2.Session()
    bad.audio.input.format.encoding = 99  # type: ignore[assignment]  (enums are open in proto3)
    frame = _pcm_frame()

    def requests() -> Iterator[speech_pb2.ConverseRequest]:
        yield speech_pb2.ConverseRequest(session_update=speech_pb2.SessionUpdate(session=bad))
        for _ in range(12):
            yield speech_pb2.ConverseRequest(
                input_audio_buffer_append=speech_pb2.InputAudioBufferAppend(audio=frame)
            )
            time.sleep(0.08)

    with grpc.insecure_channel(personaplex_served.grpc_addr) as channel:
        call = speech_pb2_grpc.SpeechStub(channel).Converse(requests(), timeout=30)
        events = list(call)
        code = call.code()
    errors = [e.error for e in events if e.HasField("error")]
    assert errors and errors[0].param == "session_update.session.audio.input.format.encoding", errors
    assert "99 is not a Realtime format" in errors[0].message
    assert any(e.HasField("response_output_audio_delta") for e in events)  # the session went on
    assert code is grpc.StatusCode.OK  # the client half-closed: a clean end


def _metric(served: Served, name: str) -> float:
    body = urllib.request.urlopen(f"{served.http_url}/metrics", timeout=10).read().decode()
    found = re.findall(rf"^{re.escape(name)} (\S+)$", body, re.M)
    return float(found[0]) if found else 0.0


def test_a_websocket_client_that_stops_reading_is_cut_by_the_send_timeout(personaplex_served: Served) -> None:
    """Defect 6: a Realtime client that stopped reading was freed only after about 40 s, by keepalive pings
    (close 1006), with no error event and no ``send_timeout`` count, whatever duplex_send_timeout_s said."""
    import websockets

    ended = 'voxstage_duplex_ended_sessions_total{reason="send_timeout"}'
    before = _metric(personaplex_served, ended)
    audio = base64.b64encode(_pcm_frame()).decode()

    async def main() -> tuple[float, int, str]:
        sock = socket.create_connection(("127.0.0.1", personaplex_served.http_port))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a client that buffers little
        url = f"ws://{personaplex_served.http_addr}/v1/realtime"
        async with websockets.connect(url, sock=sock, max_size=None, max_queue=1, ping_interval=None) as ws:
            await ws.recv()  # session.created
            stopped = time.monotonic()  # from here on it reads nothing, and keeps sending in real time
            while _metric(personaplex_served, ended) == before:
                assert time.monotonic() - stopped < 40, "not cut within 40 s"
                await ws.send(json.dumps({"type": "input_audio_buffer.append", "audio": audio}))
                await asyncio.sleep(0.08)
            cut = time.monotonic() - stopped
            kinds = []
            with pytest.raises(websockets.ConnectionClosed) as closed:
                while True:  # it reads again: what was buffered, then the dropped connection
                    kinds.append(json.loads(await asyncio.wait_for(ws.recv(), 5))["type"])
            return cut, closed.value.rcvd.code if closed.value.rcvd else 1006, ",".join(sorted(set(kinds)))

    cut, code, kinds = asyncio.run(main())
    print(f"cut {cut:.1f} s after the client stopped reading (send timeout {DUPLEX_SEND_TIMEOUT_S:g} s); "
          f"close {code}; it had been sent {kinds}")  # fmt: skip
    assert _metric(personaplex_served, ended) == before + 1
    assert code in (1006, 1008)  # 1008 with the error event if it reads within a second, else dropped
    # Its session slot is free again: a new session is admitted.
    with grpc.insecure_channel(personaplex_served.grpc_addr) as channel:
        first = next(iter(speech_pb2_grpc.SpeechStub(channel).Converse(iter(()), timeout=10)))
    assert first.HasField("session_created")
