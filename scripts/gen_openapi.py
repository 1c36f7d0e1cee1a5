"""Writes docs/openapi.json, the OpenAPI schema of the gateway's HTTP face, from the FastAPI app itself.

    python scripts/gen_openapi.py              # write docs/openapi.json (then commit the result)
    python scripts/gen_openapi.py --out FILE   # write elsewhere

The speech route reads its raw body (to bound its size before parsing), so FastAPI cannot see its request
model; this script declares ``SpeechRequest`` as that route's JSON body. The HTTP fuzz test
(tests/unit/gateway/test_fuzz_http.py) generates requests from this schema, and a test checks that the
checked-in copy is what this script writes today.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "docs" / "openapi.json"
SPEECH = "/v1/audio/speech"
VOICES = "/v1/audio/voices"
# The upload route parses its own bounded multipart body (gateway/http/voices.py), so its form is declared
# here: a sample file, its transcript and the voice's metadata.
VOICE_UPLOAD = {
    "title": "VoiceUpload",
    "type": "object",
    "required": ["name", "audio"],
    "properties": {
        "name": {"type": "string", "maxLength": 64},
        "audio": {"type": "string", "format": "binary"},
        "ref_text": {"type": "string"},
        "model": {"type": "string"},
        "language": {"type": "string"},
        "description": {"type": "string"},
        "consent_audio": {"type": "string", "format": "binary"},
    },
}


async def _app_schema() -> dict[str, Any]:
    from gateway.core import GatewayCore
    from gateway.http.app import build_app
    from voxstage import families
    from voxstage.config import load_deploy_config

    seed = REPO / families.default_family().deploy_file
    # The app is only built, never served: the replica addresses are placeholders nothing dials (the pools'
    # channels need an event loop to be made, and are closed again).
    core = GatewayCore(load_deploy_config(seed, platform="cpu"), ["127.0.0.1:1"], ["127.0.0.1:1"])
    try:
        return build_app(core).openapi()
    finally:
        await core.stop()


def build_schema() -> dict[str, Any]:
    from gateway.http.speech import SpeechRequest

    schema = asyncio.run(_app_schema())
    body = SpeechRequest.model_json_schema(ref_template="#/components/schemas/{model}")
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components.update(body.pop("$defs", {}))
    components[SpeechRequest.__name__] = body
    schema["paths"][VOICES]["post"]["requestBody"] = {
        "required": True,
        "content": {"multipart/form-data": {"schema": {"$ref": "#/components/schemas/VoiceUpload"}}},
    }
    components["VoiceUpload"] = VOICE_UPLOAD
    schema["paths"][SPEECH]["post"]["requestBody"] = {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{SpeechRequest.__name__}"}}
        },
    }
    return schema


def render() -> str:
    return json.dumps(build_schema(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    args.out.write_text(render(), encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
