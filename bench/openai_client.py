"""The official ``openai`` Python client as a load-generator transport (``--api openai``, issue 29).

Users meet the HTTP face through this client, on connections it keeps alive between requests, and that is
where Nagle's delay hid: a client that closes a response early, or opens a fresh connection per request
(``--api http``), never sees it. So one ``AsyncOpenAI`` serves every request of a run, its pool keeps every
connection it opened, and each response is read to its end with ``with_streaming_response`` (the client's
own streaming path: ``response_format: pcm``, no ``stream`` field, as a user would write it).

The clock starts just before ``create`` is called, so the client's own request building is inside TTFA; a
PCM read's time is when ``iter_bytes`` hands it over. The transport counts the TCP connections it opened
(httpcore's ``trace`` extension), which says whether requests really ran on kept-alive connections.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import openai

from bench.clients import LOCAL_SLACK_S, Synthesis
from bench.records import Outcome

try:  # openai >= 3 builds on httpx2; older releases on httpx
    import httpx2 as http
except ImportError:  # pragma: no cover - depends on the installed openai
    import httpx as http  # type: ignore[no-redef]


class OpenAIClient:
    api = "openai"

    def __init__(self, host: str, port: int) -> None:
        self.connections_opened = 0
        self.requests = 0

        async def trace(event: str, info: dict[str, Any]) -> None:
            if event == "connection.connect_tcp.complete":
                self.connections_opened += 1

        async def on_request(request: Any) -> None:
            request.extensions["trace"] = trace

        # No cap on kept-alive connections: a closed search at c streams keeps c of them (the client's default
        # keeps 100 and would open fresh ones above that).
        pool = http.Limits(max_connections=None, max_keepalive_connections=None, keepalive_expiry=None)
        self._http = openai.DefaultAsyncHttpxClient(limits=pool, event_hooks={"request": [on_request]})
        self._client = openai.AsyncOpenAI(
            base_url=f"http://{host}:{port}/v1", api_key="unused", max_retries=0, http_client=self._http
        )

    async def connect(self, timeout_s: float) -> None:
        # One request before the clock runs opens the first kept-alive connection (GET /v1/models).
        async with asyncio.timeout(timeout_s):
            await self._client.models.list()

    async def aclose(self) -> None:
        await self._client.close()

    def transport(self) -> dict[str, int]:
        """For the run's JSON: connections opened against requests made (kept-alive: far fewer)."""
        return {"connections_opened": self.connections_opened, "requests": self.requests}

    async def run(self, s: Synthesis, timeout_s: float) -> Outcome:
        extra: dict[str, Any] = {"seed": s.seed}
        if s.language:
            extra["language"] = s.language
        if s.max_frames is not None:
            extra["max_frames"] = s.max_frames
        self.requests += 1
        out = Outcome(start=time.perf_counter())
        try:
            async with asyncio.timeout(timeout_s + LOCAL_SLACK_S):
                async with self._client.audio.speech.with_streaming_response.create(
                    model=s.model, voice=s.voice, input=s.text, response_format="pcm", extra_body=extra,
                    timeout=timeout_s,
                ) as response:  # fmt: skip
                    out.sample_rate = int(response.headers.get("x-voxstage-sample-rate", "0") or 0)
                    out.request_id = response.headers.get("x-request-id", "")
                    async for chunk in response.iter_bytes():
                        out.reads.append((time.perf_counter(), len(chunk)))
            out.end = time.perf_counter()
            out.ok, out.code = True, "OK"
        except openai.APIStatusError as exc:
            out.code, out.detail = f"HTTP_{exc.status_code}", str(exc.message)[:300]
        except (TimeoutError, openai.APITimeoutError):
            out.code, out.detail = "TIMEOUT", f"response not complete within {timeout_s:.0f} s"
        except openai.APIConnectionError as exc:
            out.code, out.detail = "CONNECT", f"{type(exc).__name__}: {exc}"
        except http.HTTPError as exc:  # the body broke off after it began (a raw stream cut on a failure)
            out.code, out.detail = "TRUNCATED", f"{type(exc).__name__}: {exc}"
        return out
