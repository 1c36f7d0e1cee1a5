"""``gateway``: the public face's listen addresses, admission limits, timeouts, security and discovery.

Not in the vllm-omni seeds; voxstage's own section. Its own module, like every section the cross-key checks
read, so ``checks.py`` can name its type without importing ``deploy.py`` (which imports the checks).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from voxstage.config.base import StrictModel


class GatewayConfig(StrictModel):
    """The public face: listen addresses, admission limits and timeouts (not in the seeds; ours only)."""

    # All interfaces, because the gateway normally runs in a container whose port is published.
    host: str = Field(default="0.0.0.0", min_length=1)
    grpc_port: int = Field(default=50051, ge=1, le=65535)
    http_port: int = Field(default=8000, ge=1, le=65535)
    max_concurrent_requests: int | None = Field(default=None, ge=1)
    max_queue: int = Field(default=64, ge=0)
    queue_timeout_s: float = Field(default=30.0, gt=0.0)
    max_text_chars: int = Field(default=4096, ge=1)
    # The most frames one take may be asked for (a request's max_frames); unset: the talker stage's
    # default_sampling_params.max_tokens. A request may lower its text-derived cap, never lift it past this.
    max_frames_limit: int | None = Field(default=None, ge=1, lt=2**32)
    # StreamingSynthesize: "sentence" also flushes wherever a sentence ends in the client's deltas
    # (voxstage.segments.SentenceFlusher); "off" leaves segment boundaries to the client's flushes.
    auto_flush: Literal["off", "sentence"] = "off"
    # Voice names (OpenAI's, or any) standing for voices of the served model: alias -> voice. Unset: the
    # family's built-in table (gateway/voice_aliases.py); {} turns aliases off. Targets are checked against
    # the model's voices once the gateway knows them (a missing one is logged, and refused per request).
    voice_aliases: dict[str, str] | None = None
    # The voice library (gateway/voices/): one file per uploaded voice under this directory, shared by every
    # gateway replica that mounts it; unset turns the library off (uploads are refused, built-in voices
    # only). Bounds: voices in the library, and each sample's seconds and bytes (at most half of a request's
    # reference clip bound, so a sample and its consent recording fit one request).
    voice_store_dir: str | None = Field(default=None, min_length=1)
    voice_max_count: int = Field(default=1000, ge=1, le=1_000_000)
    voice_max_seconds: float = Field(default=30.0, gt=0.0, le=30.0)
    voice_max_bytes: int = Field(default=5 * 1024 * 1024, ge=1024, le=5 * 1024 * 1024)
    # "required": an upload must carry a consent recording (stored beside the sample, listed for audit).
    voice_consent: Literal["off", "required"] = "off"
    # Duplex sessions (session_mode: duplex): closed after this long without client audio, and after this
    # long in all; a session holds a talker slot for its whole life, so neither may be unbounded (a day at
    # most, as for streaming calls below).
    duplex_idle_timeout_s: float = Field(default=30.0, gt=0.0)
    duplex_max_session_s: float = Field(default=3600.0, gt=0.0, le=86400.0)
    # A client that keeps its connection but stops reading parks the session's agent audio in its face's
    # write; beyond this the gateway ends the session and frees its slots instead of waiting for a disconnect.
    duplex_send_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    # Streaming calls (gRPC StreamingSynthesize; on HTTP, a response the client does not take, and every
    # request): each holds an admission slot and a codec stream until it ends, so a client that sends nothing
    # or takes no audio is ended after the idle timeout, and every call after the lifetime limit; neither may
    # be unbounded, or a few forgotten clients refuse everyone else.
    stream_idle_timeout_s: float = Field(default=30.0, gt=0.0, le=3600.0)
    max_stream_lifetime_s: float = Field(default=3600.0, gt=0.0, le=86400.0)
    # The HTTP face (uvicorn, h11): bounds on how long a connection may hold the server without sending a
    # whole request (slow headers, a body that stalls behind its Content-Length), on the size of the request
    # line plus headers, and on how long an idle keep-alive connection stays open.
    http_header_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    http_max_header_bytes: int = Field(default=16384, ge=1024, le=1048576)
    http_body_timeout_s: float = Field(default=10.0, gt=0.0, le=300.0)
    http_keep_alive_timeout_s: int = Field(default=5, ge=1, le=300)
    # Fair sharing when API keys are off (with keys, each key's own limits come from api_keys_file): what
    # one client connection may hold at once, and how many requests or sessions it may start a second.
    connection_max_streams: int | None = Field(default=None, ge=1)
    connection_max_sessions: int | None = Field(default=None, ge=1)
    connection_rate: float | None = Field(default=None, gt=0.0, le=1e6)
    # Security (off by default for local use): API keys from a file (one a line, ``#`` comments) and/or an
    # environment variable (comma-separated); TLS on both public ports from a PEM certificate and key; gRPC
    # reflection and ``/metrics`` on the public ports. See docs/api.md, "Authentication and TLS".
    api_keys_file: str | None = Field(default=None, min_length=1)
    api_keys_env: str | None = Field(default=None, min_length=1, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    tls_cert_file: str | None = Field(default=None, min_length=1)
    tls_key_file: str | None = Field(default=None, min_length=1)
    reflection: bool = True
    public_metrics: bool = True
    # Mutual TLS on the gateway's links to the stages (off by default: a private network). The stages take
    # the same files as ``--link-*`` flags; ``voxstage serve`` passes one set to every process.
    link_ca_file: str | None = Field(default=None, min_length=1)
    link_cert_file: str | None = Field(default=None, min_length=1)
    link_key_file: str | None = Field(default=None, min_length=1)
    link_server_name: str | None = Field(default=None, min_length=1)
    # Where the stages are (``voxstage gateway`` without --codec/--talker reads these): host:port entries,
    # a name standing for every address it resolves to (gateway/discovery.py). ``voxstage serve`` passes
    # the addresses of the stages it starts instead.
    codec_addresses: list[str] | None = Field(default=None, min_length=1)
    talker_addresses: list[str] | None = Field(default=None, min_length=1)
    # How often names among those addresses are resolved again (also at once on failure); DNS TTLs of
    # headless Services are seconds to tens of seconds, and a lookup is cheap.
    discovery_interval_s: float = Field(default=5.0, gt=0.0, le=3600.0)

    @field_validator("codec_addresses", "talker_addresses", mode="before")
    @classmethod
    def _address_list(cls, value: Any) -> Any:
        # `--set gateway.talker_addresses=a:1,b:2` arrives as one string; a YAML list is the file's form.
        return [part.strip() for part in value.split(",")] if isinstance(value, str) else value

    @field_validator("codec_addresses", "talker_addresses")
    @classmethod
    def _host_ports(cls, value: list[str] | None) -> list[str] | None:
        if value is not None:
            from voxstage.resolver import split_host_port

            for entry in value:
                host, port = split_host_port(entry)  # ValueError names the entry
                if not 0 < port < 65536:
                    raise ValueError(f"{entry!r}: port out of range")
            if len(set(value)) != len(value):
                raise ValueError(f"lists an address twice: {value}")
        return value

    @field_validator("voice_aliases")
    @classmethod
    def _aliases(cls, value: dict[str, str] | None) -> dict[str, str] | None:
        if value is None:
            return None
        table: dict[str, str] = {}
        for alias, target in value.items():
            if not alias.strip() or any(c.isspace() for c in alias):
                raise ValueError(f"alias {alias!r} must be a non-empty name without spaces")
            if not target.strip():
                raise ValueError(f"alias {alias!r} needs a target voice, got {target!r}")
            if alias.lower() in table:
                raise ValueError(f"alias {alias!r} is listed twice (names match without regard to case)")
            table[alias.lower()] = target.strip()  # voices are matched without regard to case too
        return table

    @model_validator(mode="after")
    def _distinct_ports(self) -> GatewayConfig:
        if self.grpc_port == self.http_port:
            raise ValueError(f"grpc_port and http_port must differ (both are {self.grpc_port})")
        return self

    @model_validator(mode="after")
    def _tls_pair(self) -> GatewayConfig:
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            have, missing = ("tls_cert_file", "tls_key_file")
            if self.tls_cert_file is None:
                have, missing = missing, have
            raise ValueError(f"gateway.{have} is set but gateway.{missing} is not: TLS needs both PEM files")
        return self

    @model_validator(mode="after")
    def _link_set(self) -> GatewayConfig:
        files = {"link_ca_file": self.link_ca_file, "link_cert_file": self.link_cert_file,
                 "link_key_file": self.link_key_file}  # fmt: skip
        missing = [f"gateway.{name}" for name, value in files.items() if value is None]
        if len(missing) == len(files):
            if self.link_server_name is not None:
                raise ValueError(
                    "gateway.link_server_name is set but mTLS on the stage links is off: it also needs "
                    "gateway.link_ca_file, gateway.link_cert_file and gateway.link_key_file"
                )
        elif missing:
            raise ValueError(
                f"{', '.join(missing)} not set: mTLS on the stage links needs gateway.link_ca_file, "
                "gateway.link_cert_file and gateway.link_key_file together"
            )
        return self

    @property
    def api_keys_configured(self) -> bool:
        return self.api_keys_file is not None or self.api_keys_env is not None

    @property
    def tls(self) -> bool:
        return self.tls_cert_file is not None and self.tls_key_file is not None
