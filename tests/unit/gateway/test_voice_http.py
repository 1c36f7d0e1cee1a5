"""The voice routes' refusals that need no cloning model (the gateway in front of stage doubles
serving a CustomVoice checkpoint): a model that cannot clone, a gateway without a voice store, a body
that is not a form, and built-in voices. Uploads that succeed run on real stacks
(tests/integration/test_voice_library.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
from gateway_fakes import MODEL
from gateway_kit import MakeStack

SAMPLE = b"RIFF" + bytes(100)


async def test_a_model_that_cannot_clone_refuses_uploads_naming_it(
    make_stack: MakeStack, tmp_path: Path
) -> None:
    stack = await make_stack(overrides=[f"gateway.voice_store_dir={tmp_path}"])
    async with httpx.AsyncClient(base_url=stack.http_url) as client:
        r = await client.post("/v1/audio/voices", data={"name": "n", "ref_text": "hi"},
                              files={"audio": ("a.wav", SAMPLE)})  # fmt: skip
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (
            error["param"] == "model"
            and MODEL in error["message"]
            and error["code"] == "voice_clone_not_supported"
        )
        r = await client.post("/v1/audio/voices", json={"name": "n"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "body", r.text
        r = await client.delete("/v1/audio/voices/serena")  # a built-in voice
        assert r.status_code == 400 and r.json()["error"]["param"] == "id", r.text
        r = await client.get("/v1/audio/voices")
        assert [v["uploaded"] for v in r.json()["voices"]] == [False] * len(r.json()["voices"])
        r = await client.post("/v1/audio/speech", json={"input": "hi", "voice": "nobody"})
        assert r.status_code == 404 and r.json()["error"]["param"] == "voice", r.text
    stored = await asyncio.to_thread(lambda: sorted(p.name for p in tmp_path.rglob("*")))
    assert stored == ["names", "tmp", "voices"]  # nothing was written


async def test_without_a_voice_store_the_routes_name_the_key(make_stack: MakeStack) -> None:
    stack = await make_stack()
    async with httpx.AsyncClient(base_url=stack.http_url) as client:
        r = await client.post("/v1/audio/voices", data={"name": "n"}, files={"audio": ("a.wav", SAMPLE)})
        assert r.status_code == 400 and r.json()["error"]["param"] == "gateway.voice_store_dir", r.text
        r = await client.get("/v1/audio/voices/n")
        assert r.status_code == 400 and r.json()["error"]["param"] == "gateway.voice_store_dir", r.text
        assert (await client.get("/v1/audio/voices")).status_code == 200
