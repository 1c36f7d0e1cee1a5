"""Issue 26, defect 7: what the docs say and what validation does agree, one case at a time.

- a Realtime close code is the one docs/api.md's table names for the session's status (a talker dying
  mid-session closed with 1013 where the docs said 1011: 1013 is right, a new session can start once a
  replica serves again, and the docs now say so);
- numbers are numbers on every face: Realtime refused ``voxstage.top_p: "0.5"`` no more than HTTP did;
- an audio decode error names no server object (``<_io.BytesIO object at 0x...>``);
- base64 with line breaks (RFC 2045, ``base64`` on the command line) is accepted wherever base64 is.
``public_metrics: false`` meaning "only with a key" is in test_security_keys.py.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import grpc
import pytest
from pydantic import ValidationError

from gateway.duplex.session import Ended
from gateway.errors import GatewayError
from gateway.realtime.events import SessionUpdateEvent
from gateway.realtime.ws import close_code
from voxstage.audio import AudioError, audio_from_base64, decode_audio
from voxstage.duplex_audio import decode_base64

API_DOC = (Path(__file__).resolve().parents[3] / "docs" / "api.md").read_text()


def documented_close_codes() -> dict[grpc.StatusCode, int]:
    section = API_DOC[API_DOC.index("| close code |", API_DOC.index("**Close codes.**")) :]
    table = section[: section.index("\n\n")]
    out: dict[grpc.StatusCode, int] = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for name in re.findall(r"`([A-Z_]+)`", cells[2]):
            out[grpc.StatusCode[name]] = int(cells[0].split()[0])
    return out


def test_realtime_close_codes_are_the_documented_ones() -> None:
    documented = documented_close_codes()
    assert grpc.StatusCode.UNAVAILABLE in documented and len(documented) == 9
    for code, close in documented.items():
        assert close_code(GatewayError(code, "x")) == close, code
        assert close_code(Ended("failed", GatewayError(code, "x"))) == close, code
    assert close_code(Ended("incomplete", GatewayError(grpc.StatusCode.DEADLINE_EXCEEDED, "idle"))) == 1000


@pytest.mark.parametrize("field", ["top_p", "temperature", "top_k", "seed"])
def test_realtime_numbers_are_numbers(field: str) -> None:
    with pytest.raises(ValidationError):
        SessionUpdateEvent.model_validate({"type": "session.update", "session": {"voxstage": {field: "1"}}})
    accepted = SessionUpdateEvent.model_validate(
        {"type": "session.update", "session": {"voxstage": {field: 1}}}
    )
    assert getattr(accepted.session.voxstage, field) == 1


def test_audio_decode_errors_name_no_object_address() -> None:
    for data in (b"RIFF1234WAVEjunkjunk", b"garbage" * 10):
        with pytest.raises(AudioError) as err:
            decode_audio(data, field="ref_audio")
        assert "0x" not in str(err.value) and "object at" not in str(err.value), err.value
        assert str(err.value).startswith("ref_audio: not a decodable audio file (")


def test_base64_with_line_breaks_is_accepted() -> None:
    data = bytes(range(256)) * 3
    flat = base64.b64encode(data).decode()
    wrapped = base64.encodebytes(data).decode()  # 76-character lines, as the base64 command writes
    assert "\n" in wrapped
    for text in (wrapped, wrapped.replace("\n", "\r\n"), f"data:audio/wav;base64,{wrapped}"):
        assert audio_from_base64(text) == data
    assert decode_base64(wrapped) == decode_base64(flat) == data
    for bad in (flat[:-1], flat.replace("A", "*", 1)):
        with pytest.raises(AudioError, match="not valid base64"):
            audio_from_base64(bad)
