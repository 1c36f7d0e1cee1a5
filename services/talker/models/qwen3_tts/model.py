"""Qwen3-TTS talker module tree, named so ``state_dict()`` keys are the checkpoint's ``talker.*`` keys minus
the ``talker.`` prefix (``model.layers.N.self_attn.q_proj.weight``, ``code_predictor.lm_head.K.weight``, ...).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from voxstage.nn import kv_fp8

from .backbone import KVCache, Qwen3Backbone
from .config import CodePredictorConfig, Qwen3TTSConfig, TalkerConfig


class TextProjection(nn.Module):
    """Text-embedding resize MLP: ``linear_fc2(silu(linear_fc1(x)))``, both with biases."""

    def __init__(self, text_hidden: int, out_hidden: int) -> None:
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden, bias=True)
        self.linear_fc2 = nn.Linear(text_hidden, out_hidden, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class TalkerBody(Qwen3Backbone):
    """``talker.model``: the 28-layer body plus the codec (group-0 + specials) and text embeddings."""

    def __init__(self, cfg: TalkerConfig) -> None:
        super().__init__(cfg.backbone)
        self.codec_embedding = nn.Embedding(cfg.vocab_size, cfg.backbone.hidden_size)
        self.text_embedding = nn.Embedding(cfg.text_vocab_size, cfg.text_hidden_size)


class CodePredictorBody(Qwen3Backbone):
    """``talker.code_predictor.model``: embeddings of groups 1..G-1 live here, at the *talker* width."""

    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__(cfg.backbone)
        self.codec_embedding = nn.ModuleList(
            nn.Embedding(cfg.vocab_size, talker_hidden) for _ in range(cfg.num_code_groups - 1)
        )


class CodePredictor(nn.Module):
    def __init__(self, cfg: CodePredictorConfig, talker_hidden: int) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = CodePredictorBody(cfg, talker_hidden)
        self.lm_head = nn.ModuleList(
            nn.Linear(cfg.backbone.hidden_size, cfg.vocab_size, bias=False)
            for _ in range(cfg.num_code_groups - 1)
        )
        self.small_to_mtp_projection: nn.Module
        if cfg.backbone.hidden_size != talker_hidden:
            self.small_to_mtp_projection = nn.Linear(talker_hidden, cfg.backbone.hidden_size, bias=True)
        else:
            self.small_to_mtp_projection = nn.Identity()


class Qwen3TTSTalker(nn.Module):
    """The talker of Qwen3-TTS: body, text projection, codec head and the code predictor."""

    def __init__(self, config: Qwen3TTSConfig) -> None:
        super().__init__()
        self.config = config
        t = config.talker
        hidden = t.backbone.hidden_size
        self.model = TalkerBody(t)
        self.text_projection = TextProjection(t.text_hidden_size, hidden)
        self.codec_head = nn.Linear(hidden, t.vocab_size, bias=False)
        self.code_predictor = CodePredictor(t.code_predictor, hidden)
        lo, hi = t.suppressed_range
        banned = torch.zeros(t.vocab_size, dtype=torch.bool)
        banned[lo:hi] = True
        banned[t.codec_eos_id] = False
        # Not persistent: derived from the config, absent from checkpoints.
        self.register_buffer("c0_banned", banned, persistent=False)

    @property
    def num_code_groups(self) -> int:
        return self.config.talker.num_code_groups

    @property
    def hidden_size(self) -> int:
        return self.config.talker.backbone.hidden_size

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        """``text_projection(text_embedding(ids))``: text ids -> talker-width vectors."""
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        """Group-0 codes and codec specials -> talker-width vectors."""
        return self.model.codec_embedding(ids)

    def embed_frame(self, codes: torch.Tensor) -> torch.Tensor:
        """``codes [..., G]`` -> the sum of the G group embeddings ``[..., H]``.

        Stacked then summed along the group axis, the reduction the reference performs, so results match
        bit for bit on the same device.
        """
        if codes.shape[-1] != self.num_code_groups:
            raise ValueError(
                f"codes must end with {self.num_code_groups} groups, got shape {tuple(codes.shape)}"
            )
        parts = [self.embed_codec(codes[..., 0])]
        tables = self.code_predictor.model.codec_embedding
        parts += [tables[g - 1](codes[..., g]) for g in range(1, self.num_code_groups)]
        return torch.stack(parts, dim=-2).sum(-2)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVCache,
        slot_ids: torch.Tensor | None = None,
        attn_len: int | None = None,
    ) -> torch.Tensor:
        """Talker body over input embeddings ``x [B, T, H]``; returns post-norm hidden ``[B, T, H]``."""
        return self.model(x, positions, cache, slot_ids, attn_len)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.codec_head(hidden)

    def allocate_kv_cache(
        self,
        num_slots: int,
        max_len: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        fp8: bool = False,
    ) -> KVCache:
        """The talker's pool, in the model dtype (or ``dtype``), or fp8 with the weights' static scales."""
        ref = self.codec_head.weight
        cfg, device = self.config.talker.backbone, device or ref.device
        if fp8:
            return KVCache.allocate(cfg, num_slots, max_len, device, kv_fp8.FP8, self.model.kv_fp8_scales())
        return KVCache.allocate(cfg, num_slots, max_len, device, dtype or ref.dtype)

    def allocate_predictor_cache(
        self, max_batch: int, device: torch.device | str | None = None, dtype: torch.dtype | None = None
    ) -> KVCache:
        """Frame-local cache of the code predictor: positions 0..G-1 (2-token prefill + G-2 steps)."""
        ref = self.codec_head.weight
        return KVCache.allocate(
            self.config.talker.code_predictor.backbone,
            max_batch,
            self.num_code_groups,
            device or ref.device,
            dtype or ref.dtype,
        )
