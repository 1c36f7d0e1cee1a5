"""PersonaPlex sessions over a fixed pool of packed slots: prefill of the prompt, then one frame per tick.

Owns every device tensor (the ring KV pool, per-slot ``DuplexState``, the depformer's frame scratch) and
the session life cycle a duplex engine drives, all on the engine thread:

``admit`` (sampling, seed) -> ``prefill`` chunks of the prompt -> ``start_decode`` -> per tick
``set_user`` + ``launch`` / ``collect`` -> ``move_slot`` when another session leaves.

``decode_core(b, attn_len, greedy)`` is the unit a CUDA graph captures: the whole frame (temporal step,
text sampling, 8 depformer steps with sampling, state update) for slots ``[0, b)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
import torch

from services.talker.duplex.engine import DuplexAdapter
from services.talker.kv import kv_cache_fp8
from services.talker.launch import HostRing, Pending, all_inactive, bucket, collect
from voxstage.cudagraphs import GraphCache
from voxstage.host_copy import to_device, upload
from voxstage.nn.kv_fp8 import FP8
from voxstage.quote import quoted

from ...sampling import SamplingParams
from .config import AGENT_STREAMS, LMConfig
from .frame import OUT_ROWS, DepformerScratch, DuplexState, frame_step
from .model import PersonaPlexLM, RingKV
from .prefill_graphs import PrefillGraphs
from .prompt import Prompt, PromptError, VoiceEmbeddings, build_prompt
from .tokenizer import PersonaTokenizer
from .voices import VoiceLibrary

MIN_ATTN_BUCKET = 64


class PersonaPlexAdapter(DuplexAdapter):
    def __init__(
        self,
        model: PersonaPlexLM,
        tokenizer: PersonaTokenizer | None = None,
        voices: VoiceLibrary | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.voices = voices
        self.config: LMConfig = model.config
        self.device = model.device
        self.dtype = model.dtype
        self.num_groups = AGENT_STREAMS
        self.codebook_size = self.config.card
        self.graphs: GraphCache | None = None
        self.prefill_graphs: PrefillGraphs | None = None  # whole prompts padded and replayed (CUDA graphs)
        self._padded_prefill = False
        self.kv_fp8 = False
        # Stored voices as prompts use them: on the device in the model's dtype, made on first use. A join
        # burst copied each session's voice rows from host memory, a synchronizing copy per session (on the
        # H200, 130 syncs and 4.2 ms of a 64-session prefill call against 1.5 ms with the rows on the device).
        self._stored: dict[str, VoiceEmbeddings] = {}

    def use_kv_cache_dtype(self, name: str) -> None:
        """``kv_cache_dtype`` (before ``allocate``): ``auto`` keeps the Helium ring in the model dtype,
        ``fp8`` stores it as e4m3 with static per-head scales. The depformer's frame-local scratch stays in
        the model dtype: 192 KiB per slot at 7B size, about 0.01 % of a 3000-frame bf16 ring (1.5 GiB)."""
        self.kv_fp8 = kv_cache_fp8(name)

    def kv_bytes_per_position(self) -> int:
        return RingKV.bytes_per_position(self.config, FP8 if self.kv_fp8 else self.dtype)

    def allocate(self, num_slots: int, window: int) -> None:
        """The pool: ``num_slots`` sessions with a ``window``-position ring each (at most the model's
        context; a longer call keeps going, attending to its last ``window`` positions)."""
        c = self.config
        if not 2 <= window <= c.context:
            raise ValueError(f"window must lie in [2, {c.context}] (the model's context), got {window}")
        self.num_slots, self.window = num_slots, window
        shape = (c.num_layers, num_slots, c.num_heads, window, c.head_dim)
        kw = {"device": self.device, "dtype": FP8 if self.kv_fp8 else self.dtype}
        self.kv = RingKV(torch.zeros(shape, **kw), torch.zeros(shape, **kw))  # type: ignore[arg-type]
        if self.kv_fp8:
            self.kv.k_scale, self.kv.v_scale = self.model.transformer.kv_fp8_scales()
        self.state = DuplexState.allocate(num_slots, c.num_codebooks, self.device)
        self.scratch = DepformerScratch.allocate(self.model, num_slots)
        # Pinned host buffers: the active mask up, each step's tokens [n, 9] and valid flags [n] down.
        self.host = HostRing(num_slots, OUT_ROWS, self.device)
        self._make_prefill_graphs()

    def pad_prefill(self) -> None:
        """Prefill whole prompts through ``PrefillGraphs`` (padded, static shapes) even without CUDA graphs:
        what a graphed stage replays, run eagerly (the CPU tests)."""
        self._padded_prefill = True
        self._make_prefill_graphs()

    def _make_prefill_graphs(self) -> None:
        if (self._padded_prefill or self.graphs is not None) and hasattr(self, "kv"):
            self.prefill_graphs = PrefillGraphs(self.model, self.kv, graphs=self.graphs is not None)

    def prepare(
        self, *, persona: str = "", voice: str | None = None, voice_codes: np.ndarray | None = None
    ) -> Prompt:
        """A session's prompt: a stored voice by name, or the Mimi codes of a voice WAV, and the persona."""
        if voice is not None and voice_codes is not None:
            raise PromptError("voice: name a stored voice or send voice audio, not both")
        stored = None
        if voice is not None:
            if self.voices is None or voice not in self.voices.names:
                known = ", ".join(self.voices.names) if self.voices else "none"
                raise PromptError(f"voice: unknown voice {quoted(voice)} (stored voices: {known})")
            stored = self._stored.get(voice)
            if stored is None:
                found = self.voices.get(voice, self.config.dim, self.config.num_codebooks)
                rows = found.embeddings.to(self.device, self.dtype)
                stored = self._stored[voice] = dataclasses.replace(found, embeddings=rows)
        text_ids: list[int] = []
        if persona.strip():
            if self.tokenizer is None:
                raise PromptError("persona: this model has no text tokenizer")
            text_ids = self.tokenizer.encode_persona(persona)
        return build_prompt(self.config, voice=stored, voice_codes=voice_codes, text_ids=text_ids)

    def prompt_overhead(self) -> int:
        """The most prompt positions a session takes besides its persona's tokens and its voice recording's
        frames: the longest stored voice (or none) and the silences, with a one-byte persona."""
        names = [*(self.voices.names if self.voices is not None else ()), None]
        return max(self.prepare(persona="a", voice=name).length for name in names) - 1

    def transcript(self, token: int) -> str:
        """The agent's text for one text token (empty for padding, or without a tokenizer)."""
        return self.tokenizer.piece(token) if self.tokenizer is not None else ""

    # -- session life cycle (host-side writes between ticks) -----------------------------------------------
    def admit(self, slot: int, *, seed: int, text: SamplingParams, audio: SamplingParams) -> None:
        self.state.reset_slot(slot, seed=seed, text=text, audio=audio)

    def prefill(self, slot: int, prompt: Prompt, start: int, n: int) -> None:
        """Prompt positions ``[start, start + n)`` of ``slot`` (the prompt's last position is never
        prefilled: it is the first decode input)."""
        self.prefill_many([(slot, prompt, start, n)])

    @torch.inference_mode()
    def prefill_many(self, chunks: Sequence[tuple[int, Prompt, int, int]]) -> None:
        """Several slots' chunks ``(slot, prompt, start, n)``; chunks of one ``(start, n)`` run as one batched
        call (a 7B prefill is launch-bound: a join burst's sessions share its launches)."""
        groups: dict[tuple[int, int], list[tuple[int, Prompt]]] = {}
        for slot, prompt, start, n in chunks:
            if start < 0 or n < 1 or start + n > prompt.length - 1:
                raise ValueError(
                    f"prefill [{start}, {start + n}) outside the prompt's {prompt.length - 1} positions"
                )
            if prompt.length > self.window:
                raise ValueError(
                    f"prompt of {prompt.length} positions does not fit the {self.window}-position window"
                )
            groups.setdefault((start, n), []).append((slot, prompt))
        for (start, n), members in groups.items():
            rows = self._prompt_rows([prompt for _, prompt in members], start, n)
            slots = [slot for slot, _ in members]
            index = upload(slots, self.device)
            graphs = self.prefill_graphs
            pad = graphs.pad_for(start, n) if graphs is not None else None
            if graphs is not None and pad is not None:
                graphs.run(rows, index, n, pad)
            else:
                self.model.transformer.prefill(rows, slots, start, self.kv, index)
            # Parking position: a masked decode row writes its junk K/V here, which the next chunk overwrites.
            self.state.steps.index_fill_(0, index, start + n)

    def _prompt_rows(self, prompts: Sequence[Prompt], start: int, n: int) -> torch.Tensor:
        """The input embeddings ``[len(prompts) * n, dim]`` of positions ``[start, start + n)`` of each
        prompt in turn: a replayed voice's stored rows, then the token columns (embedded in one call)."""
        heads: list[torch.Tensor | None] = []
        columns: list[np.ndarray] = []
        for prompt in prompts:
            e = prompt.num_embedded
            if start < e:
                assert prompt.embeddings is not None
                heads.append(prompt.embeddings[start : min(e, start + n)].to(self.device, self.dtype))
            else:
                heads.append(None)
            columns.append(prompt.columns[max(start, e) - e : max(start + n - e, 0)])
        embedded = iter(())
        if any(len(c) for c in columns):
            cols = to_device(torch.from_numpy(np.concatenate([c for c in columns if len(c)])), self.device)
            embedded = iter(self.model.embed(cols).split([len(c) for c in columns if len(c)]))
        parts: list[torch.Tensor] = []
        for head, c in zip(heads, columns, strict=True):
            if head is not None:
                parts.append(head)
            if len(c):
                parts.append(next(embedded))
        return torch.cat(parts)

    def start_decode(self, slot: int, prompt: Prompt) -> None:
        st = self.state
        # Pinned uploads and fills: copies from pageable memory would wait for the device, per session.
        st.column[slot] = to_device(torch.from_numpy(prompt.columns[-1]), self.device)
        st.user[slot] = to_device(torch.from_numpy(prompt.first_user), self.device)
        st.steps[slot].fill_(prompt.length - 1)
        st.forced[slot, 2:] = to_device(torch.from_numpy(prompt.first_forced), self.device)
        st.force[slot].fill_(False)
        st.force[slot, 2:].fill_(True)

    def set_user(self, slots: Sequence[int], codes: np.ndarray) -> None:
        """The user frames ``codes [n, 8]`` (Mimi codes, or -1 for no input) of the next step of ``slots``."""
        if len(slots):
            index = upload(list(slots), self.device)
            user = to_device(torch.as_tensor(codes, dtype=torch.int64), self.device)
            self.state.user.index_copy_(0, index, user)

    @torch.inference_mode()
    def move_slot(self, src: int, dst: int, kv_len: int) -> None:
        n = min(kv_len, self.window)
        if n:
            self.kv.k[:, dst, :, :n] = self.kv.k[:, src, :, :n]
            self.kv.v[:, dst, :, :n] = self.kv.v[:, src, :, :n]
        self.state.move(src, dst)

    # -- the tick -------------------------------------------------------------------------------------------
    def attn_bucket(self, max_position: int) -> int:
        """The context bucket of a step whose furthest row is at ``max_position``."""
        return bucket(min(max_position + 1, self.window), self.window, MIN_ATTN_BUCKET)

    @torch.inference_mode()
    def launch(self, active: Sequence[bool], max_position: int, all_greedy: bool = False) -> Pending:
        """Start one frame for slots ``[0, len(active))``; returns a handle, the device may still be busy."""
        n = len(active)
        b = bucket(n, self.num_slots)
        length = self.attn_bucket(max_position)
        self.host.upload_active(active, self.state.active[:b])
        if self.graphs is not None:
            self.graphs.run(b, length, int(all_greedy))
        else:
            self.decode_core(b, length, int(all_greedy))
        return self.host.download(self.state.out, self.state.out_valid, n)

    def collect(self, handle: Pending) -> tuple[np.ndarray, np.ndarray]:
        """Host arrays ``tokens [n, 9]`` (text, agent codebooks 0..7 of the frame that step finished) and
        ``valid [n]`` (false for inactive rows and a session's first step)."""
        return collect(handle)

    def step(
        self, active: Sequence[bool], max_position: int, all_greedy: bool = False
    ) -> tuple[np.ndarray, np.ndarray]:
        """Launch and collect one frame (the synchronous form)."""
        return self.collect(self.launch(active, max_position, all_greedy))

    def decode_core(self, b: int, attn_len: int, greedy: int) -> None:
        """The captured unit: static shapes for a (b, attn_len, greedy) key, no host syncs."""
        frame_step(self.model, self.kv, self.state, self.scratch, b, attn_len, all_greedy=bool(greedy))

    # -- CUDA graphs -----------------------------------------------------------------------------------------
    def enable_cuda_graphs(self) -> bool:
        # Warm-up runs execute for real; with every row inactive they leave all slot state as it was.
        self.graphs = GraphCache(
            self.decode_core, enabled=True, quiesce=lambda key: all_inactive(self.state.active)
        )
        self._make_prefill_graphs()
        return True

    def graph_keys(self) -> list[tuple[int, int, int]]:
        batches = sorted({bucket(n, self.num_slots) for n in range(1, self.num_slots + 1)})
        contexts = sorted({self.attn_bucket(p) for p in range(self.window)})
        return [(b, c, g) for b in batches for c in contexts for g in (1, 0)]

    def capture_all_graphs(self) -> int:
        """Capture every bucket before serving (no session running): a lazily captured bucket would stall
        every live session for the capture."""
        if self.graphs is None:
            return 0
        prefill = self.prefill_graphs.capture_all() if self.prefill_graphs is not None else 0
        return prefill + sum(self.graphs.capture(*key) for key in self.graph_keys())
