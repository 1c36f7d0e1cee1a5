"""The voice library as every face sees it: upload, look up, list, delete, and a request's voice resolved.

An upload is checked like a request (the cheap checks first, the audio decoded last, in a worker thread,
with the reference-clip header checks of ``voxstage.audio``), then encoded once by a codec
(``Codec.EncodeVoice``: what the codec would compute from the same clip on every request, bit for bit) and
stored. What a voice becomes is the family's business, decided by the codec and talker that serve it: the
gateway only learns from the catalog whether the model clones voices and needs a transcript, and records the
model and family the voice was encoded for, so that another model refuses it by name.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import grpc
import numpy as np

from gateway.catalog import ModelInfo
from gateway.checks import resolve_model
from gateway.errors import GatewayError, code_from_number, invalid, not_found
from gateway.routing import ReplicaPool
from gateway.voice_aliases import resolve_alias
from gateway.voices.store import (
    MAX_DESCRIPTION_CHARS,
    EncodedVoice,
    NewVoice,
    VoiceMeta,
    VoiceStore,
    check_name,
    taken,
)
from voxstage import wire
from voxstage.audio import AudioError, decode_audio
from voxstage.config import GatewayConfig
from voxstage.internal.v1 import stage_pb2
from voxstage.quote import quoted

log = logging.getLogger(__name__)
ENCODE_TIMEOUT_S = 60.0


@dataclass
class VoiceUpload:
    """An upload as a face parsed it; field names are the HTTP form's (gRPC's are the same)."""

    name: str
    audio: bytes
    ref_text: str = ""
    model: str = ""
    language: str = ""
    description: str = ""
    consent_audio: bytes | None = None


def disabled() -> GatewayError:
    return GatewayError(
        grpc.StatusCode.FAILED_PRECONDITION,
        "the voice library is off on this gateway: set gateway.voice_store_dir to a directory shared by the "
        "gateway replicas",
        field="gateway.voice_store_dir",
        reason="voice_library_off",
    )


class VoiceLibrary:
    def __init__(self, config: GatewayConfig, codecs: ReplicaPool, aliases: dict[str, str] | None) -> None:
        self.config = config
        self.codecs = codecs
        self.aliases = aliases
        root = config.voice_store_dir
        self.store = None if root is None else VoiceStore(root, max_count=config.voice_max_count)

    @property
    def enabled(self) -> bool:
        return self.store is not None

    def _store(self) -> VoiceStore:
        if self.store is None:
            raise disabled()
        return self.store

    # -- upload -------------------------------------------------------------------------------------------

    async def create(self, up: VoiceUpload, served: ModelInfo | None) -> VoiceMeta:
        store = self._store()
        name = check_name(up.name)
        model = resolve_model(up.model, served, "model")
        if not model.takes_reference:
            raise GatewayError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"model {model.name!r} ({model.variant or model.family}) cannot clone voices, so it takes no "
                "uploaded voice; serve a model that clones (e.g. a Qwen3-TTS Base checkpoint)",
                field="model",
                reason="voice_clone_not_supported",
            )
        if self.builtin(name, model) is not None:
            raise GatewayError(
                grpc.StatusCode.ALREADY_EXISTS,
                f"{quoted(name)} is a built-in voice (or voice alias) of model {model.name!r}; choose "
                "another name",
                field="name",
                reason="voice_name_builtin",
            )
        ref_text = up.ref_text.strip()
        if model.needs_reference_text and not ref_text:
            raise invalid(
                "ref_text",
                f"required: model {model.name!r} ({model.family}) clones a voice from the sample together "
                "with its transcript",
                reason="reference_text_required",
            )
        if ref_text and model.duplex_only:
            raise invalid(
                "ref_text",
                f"model {model.name!r} ({model.family}) speaks with a voice recording alone and takes no "
                "transcript; leave ref_text empty",
                reason="reference_text_not_supported",
            )
        if len(ref_text) > self.config.max_text_chars:
            raise invalid(
                "ref_text",
                f"{len(ref_text)} characters exceeds the limit of {self.config.max_text_chars} "
                "(gateway.max_text_chars)",
                reason="text_too_long",
            )
        language = ""
        if up.language:
            resolved = model.resolve_language(up.language)
            if resolved is None:
                raise invalid(
                    "language", f"{quoted(up.language)} is not supported by model {model.name!r}",
                    reason="unsupported_language",
                )  # fmt: skip
            language = resolved
        if len(up.description) > MAX_DESCRIPTION_CHARS:
            raise invalid("description", f"{len(up.description)} characters exceeds the limit of "
                          f"{MAX_DESCRIPTION_CHARS}")  # fmt: skip
        if self.config.voice_consent == "required" and not up.consent_audio:
            raise invalid(
                "consent_audio",
                "required: this gateway stores a voice only with a recording of the speaker's consent "
                "(gateway.voice_consent: required)",
                reason="consent_required",
            )
        if store.name_taken(name):  # early, before the audio is decoded and encoded; create() decides races
            raise taken(name)
        pcm, rate = await asyncio.to_thread(self._decode, up.audio, "audio")
        consent = None
        if up.consent_audio:
            consent = await asyncio.to_thread(self._decode, up.consent_audio, "consent_audio")
        if model.budget is not None:  # the voice must fit every take's prompt with room for text
            model.budget.check([("ref_text", ref_text)], pcm.size / rate, "audio")
        codes, xvec = await self._encode(model, pcm, rate, ref_text)
        new = NewVoice(
            name=name, model=model.name, family=model.family, ref_text=ref_text, language=language,
            description=up.description, audio=pcm, sample_rate=rate, codes=codes, x_vector=xvec,
            consent=consent,
        )  # fmt: skip
        meta = await asyncio.to_thread(store.create, new)
        log.info("voice library: created %s (%r) for %s", meta.id, meta.name, meta.model)
        return meta

    def _decode(self, data: bytes, field: str) -> tuple[np.ndarray, int]:
        try:
            return decode_audio(
                data, field=field, max_bytes=self.config.voice_max_bytes,
                max_seconds=self.config.voice_max_seconds,
            )  # fmt: skip
        except AudioError as exc:
            raise invalid(field, str(exc).removeprefix(f"{field}: "), reason="invalid_audio") from None

    async def _encode(
        self, model: ModelInfo, pcm: np.ndarray, rate: int, text: str
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        replica = self.codecs.pick()
        ref = stage_pb2.VoiceReference(
            audio=stage_pb2.Payload(inline=np.ascontiguousarray(pcm, "<f4").tobytes()),
            audio_format=stage_pb2.PCM_FORMAT_F32LE,
            audio_sample_rate_hz=rate,
            text=text,
        )
        try:
            reply = await replica.codec_stub.EncodeVoice(
                stage_pb2.EncodeVoiceRequest(model=model.name, reference=ref), timeout=ENCODE_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            detail = exc.details() or code.name
            # The codec names its own fields (reference.audio, reference.text): say them as the upload does.
            detail = detail.replace("reference.audio", "audio").replace("reference.text", "ref_text")
            if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                self.codecs.suspect(replica, f"EncodeVoice: {code.name}")
            raise GatewayError(code_from_number(code.value[0]), f"encoding the sample failed: {detail}",
                               reason="voice_encode_failed") from None  # fmt: skip
        out = reply.reference
        codes = xvec = None
        if out.codes.frame_count:
            codes = np.frombuffer(out.codes.codes.inline, wire.CODE_DTYPE).reshape(
                out.codes.frame_count, out.codes.num_groups
            )
        if out.x_vector_dim:
            xvec = np.frombuffer(out.x_vector.inline, "<f4").copy()
        return codes, xvec

    # -- lookups ------------------------------------------------------------------------------------------

    def builtin(self, voice: str, model: ModelInfo) -> str | None:
        """The model's built-in voice (or alias target) that ``voice`` names, or None."""
        if not model.voices:
            return None
        try:
            target = resolve_alias(voice, model, self.aliases, "voice")
        except GatewayError:
            return None
        found = model.find_voice(target)
        return found.name if found is not None else None

    def lookup(self, voice: str, model: ModelInfo, field: str) -> EncodedVoice | None:
        """The uploaded voice a request names (id or name), checked against the model it would run on;
        None when ``voice`` names no uploaded voice (or the library is off)."""
        if self.store is None or not voice or self.builtin(voice, model) is not None:
            return None
        found = self.store.resolve(voice)
        if found is None:
            return None
        meta = found.meta
        if meta.model != model.name or meta.family != model.family:
            raise GatewayError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"voice {quoted(meta.name)} ({meta.id}) was made for model {meta.model!r} ({meta.family}); "
                f"this deployment serves model {model.name!r} ({model.family}), which cannot use it; upload "
                "the sample again for this model",
                field=field,
                reason="voice_model_mismatch",
            )
        return found

    def get(self, ref: str) -> VoiceMeta:
        meta = self._store().find(ref)
        if meta is None:
            raise not_found("id", f"no uploaded voice {quoted(ref)}", reason="voice_not_found")
        return meta

    def list(self) -> list[VoiceMeta]:
        return [] if self.store is None else self.store.list()

    async def delete(self, ref: str, served: ModelInfo | None) -> VoiceMeta:
        store = self._store()
        if served is not None and self.builtin(ref, served) is not None and store.find(ref) is None:
            raise GatewayError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{quoted(ref)} is a built-in voice of model {served.name!r}; only uploaded voices can be "
                "deleted",
                field="id",
                reason="voice_builtin",
            )
        meta = await asyncio.to_thread(store.delete, ref)
        log.info("voice library: deleted %s (%r)", meta.id, meta.name)
        return meta
