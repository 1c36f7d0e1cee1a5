"""The voice library on disk: one safetensors file per voice, one name claim per voice, no shared index.

Layout under ``gateway.voice_store_dir`` (docs/operations.md, "Voice library")::

    voices/<id>.safetensors   sample, consent recording, encoded reference (codes, x-vector); metadata header
    names/<claim>             the id owning a name; <claim> is a hash of the case-folded name
    tmp/                      files being written (same filesystem, so rename and link are atomic)

Nothing a client sends becomes a path: ids are generated (``voice_`` + 24 hex digits) and checked against
that shape before use, and names only ever select a claim through their hash. A voice file is written whole
(temp file, fsync, rename, fsync of the directory) before its name is claimed with ``link``, which fails if
the claim exists: of two replicas uploading one name at once over a shared volume exactly one wins, without
any lock or shared index file to race on. A delete removes the claim first, so a name is never left pointing
at nothing by a delete; a claim whose file is gone or unreadable is reported as broken, naming the voice,
never skipped over to some other voice. Files carry a per-upload ``version``: caches downstream key by id
and version, so a re-upload under the same name is never confused with what was deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import secrets
import struct
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save

from gateway.errors import GatewayError, invalid, not_found
from voxstage import wire
from voxstage.internal.v1 import stage_pb2
from voxstage.quote import quoted

log = logging.getLogger(__name__)

FORMAT = "voxstage.voice/1"
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1000
ID_PATTERN = re.compile(r"voice_[0-9a-f]{24}")
# Letters (any script), digits, '_', '-', '.', and inner spaces. No '/', '\\', NUL or other control
# characters: names are never paths, but they are shown in logs, listings and error messages.
_NAME = re.compile(r"[\w.\-]([\w.\- ]*[\w.\-])?")
_LOADED_CACHE = 64  # parsed voices kept per gateway (keyed by file identity, so a changed file is reread)


@dataclass(frozen=True)
class VoiceInfo:
    """What an upload says of a voice, and its metadata keeps."""

    name: str
    model: str
    family: str
    ref_text: str
    language: str
    description: str


@dataclass(frozen=True)
class VoiceMeta(VoiceInfo):
    id: str
    created_ms: int
    version: str
    sample_rate: int
    sample_seconds: float
    consent: bool

    @property
    def key(self) -> str:
        """What caches of the encoded voice key by: a new upload is a new key."""
        return f"{self.id}@{self.version}"


@dataclass(frozen=True)
class EncodedVoice:
    """What a request by this voice sends: the codec's output at upload, no audio."""

    meta: VoiceMeta
    codes: np.ndarray | None  # [frames, groups] int16
    x_vector: np.ndarray | None  # [dim] float32


def encoded_reference(voice: EncodedVoice) -> stage_pb2.VoiceReference:
    """The ``StreamOpen.reference`` of a request by ``voice``: its encoding and transcript, keyed."""
    ref = wire.voice_reference(voice.meta.ref_text, voice.codes, voice.x_vector)
    ref.voice_key = voice.meta.key
    return ref


@dataclass(frozen=True)
class NewVoice(VoiceInfo):
    audio: np.ndarray  # mono float32
    sample_rate: int
    codes: np.ndarray | None
    x_vector: np.ndarray | None
    consent: tuple[np.ndarray, int] | None


def check_name(name: str, field: str = "name") -> str:
    """``name`` as stored (surrounding spaces dropped), or INVALID_ARGUMENT naming ``field``."""
    text = name.strip()
    if not text:
        raise invalid(field, "required: 1 to 64 characters", reason="invalid_voice_name")
    if len(text) > MAX_NAME_CHARS:
        raise invalid(
            field,
            f"{len(text)} characters exceeds the limit of {MAX_NAME_CHARS}",
            reason="invalid_voice_name",
        )
    if not _NAME.fullmatch(text) or set(text) == {"."}:
        raise invalid(
            field,
            f"{quoted(text)} is not a valid voice name: use letters, digits, '_', '-', '.' and inner spaces "
            "(no '/', '\\\\' or control characters)",
            reason="invalid_voice_name",
        )
    if ID_PATTERN.fullmatch(text.lower()):
        raise invalid(field, "must not have the shape of a voice id (voice_ + 24 hex digits)",
                      reason="invalid_voice_name")  # fmt: skip
    return text


def _claim_file(name: str) -> str:
    return hashlib.sha256(name.casefold().encode()).hexdigest()[:40]


def broken(meta_name: str, why: str) -> GatewayError:
    return GatewayError(
        grpc.StatusCode.DATA_LOSS,
        f"voice {quoted(meta_name)} cannot be used: {why}; delete it and upload it again",
        field="voice",
        reason="voice_broken",
    )


class VoiceStore:
    """The files of one library directory. Blocking I/O: uploads and deletes run in a worker thread; the
    lookups of a request read a claim and stat a file, and reparse a voice only when its file changed."""

    def __init__(self, root: str | Path, *, max_count: int) -> None:
        self.root = Path(root)
        self.max_count = max_count
        self.voices = self.root / "voices"
        self.names = self.root / "names"
        self.tmp = self.root / "tmp"
        for d in (self.voices, self.names, self.tmp):
            d.mkdir(parents=True, exist_ok=True)
        self._loaded: OrderedDict[tuple[str, int, int], EncodedVoice] = OrderedDict()

    # -- queries ------------------------------------------------------------------------------------------

    def count(self) -> int:
        return sum(1 for _ in self.names.iterdir())

    def name_taken(self, name: str) -> bool:
        return (self.names / _claim_file(name)).exists()

    def find(self, ref: str) -> VoiceMeta | None:
        """The voice whose id or name is ``ref``; None when there is none. A claimed voice whose file is
        missing or unreadable raises DATA_LOSS naming it."""
        voice = self.resolve(ref)
        return None if voice is None else voice.meta

    def resolve(self, ref: str) -> EncodedVoice | None:
        """``find``, with the voice's encoded reference."""
        voice_id = self._id_of(ref)
        if voice_id is None:
            return None
        try:
            return self.load(voice_id, ref)
        except GatewayError:
            # Deleted by another replica between reading the claim and the file: gone, not broken.
            if self._id_of(ref) is None:
                return None
            raise

    def load(self, voice_id: str, shown: str) -> EncodedVoice:
        path = self.voices / f"{voice_id}.safetensors"
        try:
            st = path.stat()
        except FileNotFoundError:
            raise broken(shown, f"its file {path.name} is missing from the voice store") from None
        ident = (voice_id, st.st_mtime_ns, st.st_size)
        hit = self._loaded.get(ident)
        if hit is not None:
            self._loaded.move_to_end(ident)
            return hit
        try:
            tensors, meta = _read(path)
        except (OSError, ValueError, KeyError) as exc:
            raise broken(shown, f"its file {path.name} is unreadable ({exc})") from None
        if meta.id != voice_id:
            raise broken(shown, f"its file {path.name} holds voice {meta.id}")
        voice = EncodedVoice(meta, tensors.get("codes"), tensors.get("x_vector"))
        self._loaded[ident] = voice
        while len(self._loaded) > _LOADED_CACHE:
            self._loaded.popitem(last=False)
        return voice

    def list(self) -> list[VoiceMeta]:
        """Every claimed voice, oldest first; broken ones are logged and left out of the listing (a request
        naming one still gets the DATA_LOSS that names it)."""
        out = []
        for claim in self.names.iterdir():
            try:
                voice_id = claim.read_text().strip()
                out.append(self.load(voice_id, voice_id).meta)
            except (OSError, GatewayError) as exc:
                log.warning("voice store: claim %s: %s", claim.name, exc)
        return sorted(out, key=lambda m: (m.created_ms, m.id))

    def audio(self, meta: VoiceMeta) -> dict[str, np.ndarray]:
        """Sample and consent recording of a voice (for audit and export)."""
        tensors, _ = _read(self.voices / f"{meta.id}.safetensors", ("audio", "consent_audio"))
        return tensors

    def _id_of(self, ref: str) -> str | None:
        ref = ref.strip()
        if ID_PATTERN.fullmatch(ref):
            claimed = self._claimed_id(self._meta_name(ref))
            return ref if claimed == ref else None
        if not ref or len(ref) > MAX_NAME_CHARS or not _NAME.fullmatch(ref):
            return None
        return self._claimed_id(ref)

    def _meta_name(self, voice_id: str) -> str:
        path = self.voices / f"{voice_id}.safetensors"
        try:
            return _read_meta(path).name
        except FileNotFoundError:
            return ""
        except (OSError, ValueError, KeyError) as exc:
            raise broken(voice_id, f"its file {path.name} is unreadable ({exc})") from None

    def _claimed_id(self, name: str) -> str | None:
        if not name:
            return None
        try:
            voice_id = (self.names / _claim_file(name)).read_text().strip()
        except FileNotFoundError:
            return None
        if not ID_PATTERN.fullmatch(voice_id):
            raise broken(name, "its name claim is unreadable")
        return voice_id

    # -- changes ------------------------------------------------------------------------------------------

    def create(self, new: NewVoice) -> VoiceMeta:
        """Write the voice, then claim its name; ALREADY_EXISTS when another upload claimed it first."""
        if self.count() >= self.max_count:
            raise full(self.max_count)
        voice_id = "voice_" + secrets.token_hex(12)
        now = time.time_ns()
        meta = VoiceMeta(
            id=voice_id, name=new.name, model=new.model, family=new.family, ref_text=new.ref_text,
            language=new.language, description=new.description, created_ms=now // 1_000_000,
            version=f"{now:x}", sample_rate=new.sample_rate,
            sample_seconds=round(new.audio.size / new.sample_rate, 3), consent=new.consent is not None,
        )  # fmt: skip
        tensors: dict[str, np.ndarray] = {"audio": np.ascontiguousarray(new.audio, np.float32)}
        header = _header(meta)
        if new.consent is not None:
            tensors["consent_audio"] = np.ascontiguousarray(new.consent[0], np.float32)
            header["consent_sample_rate"] = str(new.consent[1])
        if new.codes is not None:
            tensors["codes"] = np.ascontiguousarray(new.codes, np.int16)
        if new.x_vector is not None:
            tensors["x_vector"] = np.ascontiguousarray(new.x_vector, np.float32)
        final = self.voices / f"{voice_id}.safetensors"
        _write_atomic(self.tmp, final, save(tensors, metadata=header))
        claim_tmp = self.tmp / f"{voice_id}.claim"
        _write_atomic(self.tmp, claim_tmp, f"{voice_id}\n".encode(), rename=False)
        try:
            os.link(claim_tmp, self.names / _claim_file(new.name))
        except FileExistsError:
            final.unlink(missing_ok=True)
            raise taken(new.name) from None
        finally:
            claim_tmp.unlink(missing_ok=True)
        _fsync_dir(self.names)
        return meta

    def delete(self, ref: str) -> VoiceMeta:
        """Remove the voice named by id or name: its claim first, then its file."""
        voice_id = self._id_of(ref)
        if voice_id is None:
            raise not_found("id", f"no uploaded voice {quoted(ref)}", reason="voice_not_found")
        try:
            meta = self.load(voice_id, ref).meta
            name = meta.name
        except GatewayError:  # a broken voice can still be deleted, by name
            meta, name = None, ref
        claim = self.names / _claim_file(name)
        with contextlib.suppress(FileNotFoundError):
            if claim.read_text().strip() == voice_id:
                claim.unlink()
        (self.voices / f"{voice_id}.safetensors").unlink(missing_ok=True)
        _fsync_dir(self.names)
        if meta is None:
            meta = VoiceMeta(
                name=name, model="", family="", ref_text="", language="", description="", id=voice_id,
                created_ms=0, version="", sample_rate=0, sample_seconds=0.0, consent=False,
            )  # fmt: skip
        return meta


def taken(name: str) -> GatewayError:
    return GatewayError(
        grpc.StatusCode.ALREADY_EXISTS,
        f"a voice named {quoted(name)} already exists; delete it first or choose another name",
        field="name",
        reason="voice_name_taken",
    )


def full(limit: int) -> GatewayError:
    return GatewayError(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        f"the voice library holds its limit of {limit} voices (gateway.voice_max_count); delete one first",
        field="name",
        reason="voice_library_full",
    )


def _header(meta: VoiceMeta) -> dict[str, str]:
    return {
        "format": FORMAT, "id": meta.id, "name": meta.name, "model": meta.model, "family": meta.family,
        "ref_text": meta.ref_text, "language": meta.language, "description": meta.description,
        "created_ms": str(meta.created_ms), "version": meta.version, "sample_rate": str(meta.sample_rate),
        "sample_seconds": repr(meta.sample_seconds), "consent": "1" if meta.consent else "0",
    }  # fmt: skip


def _meta(header: dict[str, str]) -> VoiceMeta:
    if header.get("format") != FORMAT:
        raise ValueError(f"not a {FORMAT} file")
    return VoiceMeta(
        id=header["id"], name=header["name"], model=header["model"], family=header["family"],
        ref_text=header["ref_text"], language=header["language"], description=header["description"],
        created_ms=int(header["created_ms"]), version=header["version"],
        sample_rate=int(header["sample_rate"]),
        sample_seconds=float(header["sample_seconds"]), consent=header["consent"] == "1",
    )  # fmt: skip


ENCODED = ("codes", "x_vector")  # what a request needs; the sample and consent audio stay on disk


def _read(path: Path, names: tuple[str, ...] = ENCODED) -> tuple[dict[str, np.ndarray], VoiceMeta]:
    """The tensors ``names`` (those the file has) and the metadata; the file's layout is checked whole."""
    try:
        with safe_open(str(path), "np") as f:
            header = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in names if k in f.keys()}  # noqa: SIM118 - not a dict
    except FileNotFoundError:
        raise
    except Exception as exc:  # safetensors raises its own error type for a damaged file
        raise ValueError(str(exc) or type(exc).__name__) from None
    return tensors, _meta(header)


def _header_of(data: bytes) -> dict[str, str]:
    if len(data) < 8:
        raise ValueError("truncated")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise ValueError("truncated header")
    return dict(json.loads(data[8 : 8 + n]).get("__metadata__", {}))


def _read_meta(path: Path) -> VoiceMeta:
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError("truncated")
        (n,) = struct.unpack("<Q", head)
        if n > 16 * 1024 * 1024:
            raise ValueError("header too large")
        return _meta(_header_of(head + f.read(n)))


def _write_atomic(tmp_dir: Path, final: Path, data: bytes, *, rename: bool = True) -> None:
    """``data`` at ``final`` in full or not at all: a temp file, fsynced, renamed, directory fsynced."""
    tmp = tmp_dir / f".{final.name}.{secrets.token_hex(4)}" if rename else final
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o640)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if rename:
            os.replace(tmp, final)
            _fsync_dir(final.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
