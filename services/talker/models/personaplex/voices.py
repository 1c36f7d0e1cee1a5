"""PersonaPlex's stored voices: ``voices.tgz`` (as released) or a ``voices/`` folder of ``NAME.pt`` files.

Each file is what NVIDIA's server saves after running a voice WAV through the prompt: a dict with
``embeddings`` (the LM input embedding of every voice-prompt step, ``[steps, 1, 1, dim]``) and ``cache`` (its
token cache afterwards, ``[1, 17, columns]``). Names are listed at load; a file is read on first use.
"""

from __future__ import annotations

import io
import tarfile
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

import numpy as np
import torch

from voxstage.checkpoint import CheckpointError

from .config import AGENT_STREAMS
from .prompt import VoiceEmbeddings

if TYPE_CHECKING:
    from .model import PersonaPlexLM

ARCHIVE = "voices.tgz"
FOLDER = "voices"


class VoiceLibrary:
    def __init__(self, readers: dict[str, Callable[[], bytes]], *, source: str) -> None:
        self._readers = readers
        self._loaded: dict[str, VoiceEmbeddings] = {}
        self.source = source

    @classmethod
    def from_checkpoint(cls, checkpoint_dir: Path) -> VoiceLibrary:
        """Voices of a checkpoint directory (a ``voices/`` folder wins over ``voices.tgz``; none is fine)."""
        folder, archive = checkpoint_dir / FOLDER, checkpoint_dir / ARCHIVE
        if folder.is_dir():
            files = {p.stem: p for p in sorted(folder.glob("*.pt"))}
            return cls({name: path.read_bytes for name, path in files.items()}, source=str(folder))
        if archive.is_file():
            return cls(_archive_readers(archive), source=str(archive))
        return cls({}, source=str(checkpoint_dir))

    @classmethod
    def of(cls, voices: dict[str, VoiceEmbeddings], *, source: str) -> VoiceLibrary:
        """A library of voices already in memory (size-true presets make theirs at load)."""
        library = cls({name: _unreadable(name) for name in voices}, source=source)
        library._loaded.update(voices)
        return library

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._readers))

    def get(self, name: str, dim: int, rows: int) -> VoiceEmbeddings:
        voice = self._loaded.get(name)
        if voice is None:
            reader = self._readers.get(name)
            if reader is None:
                raise KeyError(name)
            voice = parse_voice(reader(), dim=dim, rows=rows, source=f"{self.source}:{name}")
            self._loaded[name] = voice
        return voice


def _unreadable(name: str) -> Callable[[], bytes]:
    def read() -> bytes:
        raise CheckpointError(f"voice {name!r} has no file")

    return read


def _archive_readers(archive: Path) -> dict[str, Callable[[], bytes]]:
    try:
        with tarfile.open(archive) as tar:
            members = [m.name for m in tar.getmembers() if m.isfile() and m.name.endswith(".pt")]
    except (tarfile.TarError, OSError) as exc:
        raise CheckpointError(f"{archive} is not a readable tar archive: {exc}") from exc

    def reader(member: str) -> Callable[[], bytes]:
        def read() -> bytes:
            with tarfile.open(archive) as tar:
                handle = tar.extractfile(member)
                if handle is None:
                    raise CheckpointError(f"{archive}: {member} is not a file")
                return handle.read()

        return read

    return {PurePosixPath(m).stem: reader(m) for m in members}


def parse_voice(data: bytes, *, dim: int, rows: int, source: str) -> VoiceEmbeddings:
    try:
        # weights_only: a voice file must hold tensors, never pickled code.
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - torch raises many types for a corrupt file; all mean the same
        raise CheckpointError(f"{source} is not a readable voice file: {exc}") from exc
    if not isinstance(obj, dict) or not {"embeddings", "cache"} <= obj.keys():
        raise CheckpointError(f"{source}: a voice file must be a dict with 'embeddings' and 'cache'")
    emb, cache = obj["embeddings"], obj["cache"]
    if not isinstance(emb, torch.Tensor) or emb.shape[-1] != dim or emb.numel() % dim:
        raise CheckpointError(
            f"{source}: embeddings must end in dimension {dim}, got {getattr(emb, 'shape', None)}"
        )
    if not isinstance(cache, torch.Tensor) or cache.shape[-2:-1] != (rows,) or cache.numel() % rows:
        raise CheckpointError(
            f"{source}: cache must be [1, {rows}, columns], got {getattr(cache, 'shape', None)}"
        )
    return VoiceEmbeddings(
        embeddings=emb.reshape(-1, dim).float(),
        cache=np.ascontiguousarray(cache.reshape(rows, -1).numpy().astype(np.int64)),
    )


def write_voice(path: Path, embeddings: torch.Tensor, cache: np.ndarray) -> None:
    """Write a voice file in the released layout (``[steps, 1, 1, dim]`` embeddings, ``[1, 17, C]`` cache)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "embeddings": embeddings.reshape(embeddings.shape[0], 1, 1, -1).contiguous(),
            "cache": torch.from_numpy(np.asarray(cache, np.int64)).unsqueeze(0).contiguous(),
        },
        path,
    )


def voice_from_codes(model: PersonaPlexLM, codes: np.ndarray) -> VoiceEmbeddings:
    """A stored voice made from the Mimi codes of a voice prompt (what NVIDIA's server saves as
    ``voices/NAME.pt``): the embeddings of the voice steps' input columns and the token cache after them.
    Replaying it gives the same prompt state as the codes themselves."""
    from .prompt import build_prompt

    config = model.config
    prompt = build_prompt(config, voice_codes=codes, silence_frames=0)
    if prompt.length < 2:
        raise ValueError("voice: a stored voice needs at least two frames of codes")
    steps = prompt.length - 1  # the voice's last column is restored from the cache, not replayed
    with torch.no_grad():
        columns = torch.from_numpy(prompt.columns[:steps]).to(model.device)
        embeddings = model.embed(columns).float().cpu()
    cache = np.full((config.num_codebooks, 4), -2, np.int64)  # the fork's 4-column cache; -2: ungenerated
    cache[:, steps % 4] = prompt.columns[-1]
    after = cache[:, (steps + 1) % 4]
    after[2 : 1 + AGENT_STREAMS] = prompt.first_forced
    after[2 + AGENT_STREAMS :] = prompt.first_user[1:]
    return VoiceEmbeddings(embeddings, cache)
