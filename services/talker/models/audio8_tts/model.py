"""Audio8-TTS (``arktts``) dual-AR model: the Qwen2-shaped slow AR and the 10-position fast AR.

Module and parameter names are the flat keys of the released ``model.safetensors`` (models.md §2.3:
``embeddings.weight``, ``layers.N.attention.wqkv.{weight,bias}``, ``fast_layers.N.feed_forward.w1.weight``,
...), so loading is a strict key match without renaming.

Both stacks run over the talker-wide static KV pool with the call shape of the Qwen3 backbone
(``services.talker.kv``: input rows ``[B, T]`` at absolute positions, new K/V scattered into each row's slot
first, attention reading positions ``[0, attn_len)`` under an explicit ``key <= query`` mask). Chunked
prefill (one row, T tokens) and batched decode (B rows, one token) are the same code, with no host syncs
and no value-dependent branches (CUDA-graph capturable).

Numerics of the reference (models.md §2.4): RoPE rotates interleaved (GPT-J) pairs with fp32 math, and its
cos/sin table is *stored in bf16*; vllm-omni found that an fp32 table shifts the logits enough to end
utterances early. ``rope_dtype`` exists for golden parity only: ``transformers`` (Qwen2/Llama) keeps its
table in fp32, so the parity test builds the model with ``rope_dtype=torch.float32``; serving keeps bf16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.talker.kv import (
    KVPool,
    attend,
    check_call,
    grouped_causal_mask,
    kv_bytes_per_token,
    write_index,
)
from voxstage.nn.fused import add_rmsnorm, rope_rotate, silu_mul
from voxstage.nn.layers import FusedLinears, RMSNorm

from .config import Audio8TalkerConfig, StackConfig

RELEASED_ROPE_DTYPE = torch.bfloat16


def allocate_pool(
    stack: StackConfig, slots: int, positions: int, device: torch.device | str, dtype: torch.dtype
) -> KVPool:
    """A zeroed pool of ``stack`` (the talker-wide ``KVPool``): ``slots`` rows of ``positions`` each."""
    return KVPool.zeros(stack.n_layer, slots, stack.n_local_heads, positions, stack.head_dim, device, dtype)


def rope_table(positions: int, head_dim: int, base: float, dtype: torch.dtype) -> torch.Tensor:
    """``[positions, head_dim // 2, 2]`` (cos, sin) of interleaved RoPE: angles formed in fp32 exactly as
    the reference forms them (and as transformers does), then stored in ``dtype``."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (base**exponents)
    angles = torch.outer(torch.arange(positions, dtype=torch.int64).to(torch.float32), inv_freq)
    return torch.stack((angles.cos(), angles.sin()), dim=-1).to(dtype)


class Attention(nn.Module):
    """GQA attention: one fused ``wqkv`` (q | k | v rows, bias on the slow AR only), ``wo`` without bias."""

    def __init__(self, s: StackConfig) -> None:
        super().__init__()
        self.wqkv = nn.Linear(s.dim, s.q_size + 2 * s.kv_size, bias=s.qkv_bias)
        self.wo = nn.Linear(s.q_size, s.dim, bias=False)


class FeedForward(nn.Module):
    """SiLU-gated FFN, ``w2(silu(w1 x) * w3 x)``; w1 and w3 are views of one [gate | up] weight (one GEMM,
    then the fused SiLU-product kernel on CUDA)."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self._w13 = FusedLinears(self.w1, self.w3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fused = self._w13.weight()
        if fused is None:  # the views were replaced (e.g. ``load_state_dict(assign=True)``)
            return self.w2(F.silu(self.w1(x)) * self.w3(x))
        return self.w2(silu_mul(F.linear(x, fused)))


class Block(nn.Module):
    def __init__(self, s: StackConfig) -> None:
        super().__init__()
        self.attention = Attention(s)
        self.feed_forward = FeedForward(s.dim, s.intermediate_size)
        self.attention_norm = RMSNorm(s.dim, eps=s.norm_eps)
        self.ffn_norm = RMSNorm(s.dim, eps=s.norm_eps)


def run_stack(
    layers: nn.ModuleList,
    final_norm: RMSNorm,
    s: StackConfig,
    x: torch.Tensor,
    positions: torch.Tensor,
    table: torch.Tensor,
    cache: KVPool,
    slot_ids: torch.Tensor | None,
    attn_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks over ``x [B, T, D]`` at ``positions [B, T]``; returns ``(final_norm(h), h)``, each [B, T, D].

    ``slot_ids [B]`` names each row's cache slot (None: rows ``0..B-1``, a view instead of a gather);
    ``attn_len`` (a Python int, static per captured graph) bounds the positions read and must exceed every
    position of the call. Each residual add is fused with the RMSNorm after it (one kernel on CUDA).
    """
    check_call(x, positions, attn_len, cache)
    b, t, d = x.shape
    write = write_index(positions, slot_ids)
    rope = table[positions].reshape(b * t, -1, 2).float()  # fp32 math on the stored (bf16) values
    cos, sin = rope[..., 0], rope[..., 1]
    mask = grouped_causal_mask(positions, attn_len, s.group)
    h, normed = add_rmsnorm(x.reshape(b * t, d), None, layers[0].attention_norm.weight, s.norm_eps)
    last = len(layers) - 1
    for i, layer in enumerate(layers):
        attn = _attend(layer.attention, s, normed, b, t, cos, sin, cache, i, write, slot_ids, attn_len, mask)
        h, normed = add_rmsnorm(h, attn, layer.ffn_norm.weight, s.norm_eps)
        ff = layer.feed_forward(normed)
        following = layers[i + 1].attention_norm if i < last else final_norm
        h, normed = add_rmsnorm(h, ff, following.weight, s.norm_eps)
    return normed.view(b, t, d), h.view(b, t, d)


def _attend(
    attn: Attention,
    s: StackConfig,
    x: torch.Tensor,
    b: int,
    t: int,
    cos: torch.Tensor,
    sin: torch.Tensor,
    cache: KVPool,
    layer: int,
    write: tuple[torch.Tensor, torch.Tensor],
    slot_ids: torch.Tensor | None,
    attn_len: int,
    mask: torch.Tensor,
) -> torch.Tensor:
    nh, nkv, hd = s.n_head, s.n_local_heads, s.head_dim
    q, k, v = attn.wqkv(x).split([s.q_size, s.kv_size, s.kv_size], dim=-1)
    # One rotary pass over q and k together (elementwise per head): [B*T, heads, hd] with [B*T, hd/2] tables.
    qk = rope_rotate(torch.cat((q.view(b * t, nh, hd), k.view(b * t, nkv, hd)), dim=1), cos, sin)
    q, k = qk.split([nh, nkv], dim=1)
    q, k, v = q.view(b, t, nh, hd), k.view(b, t, nkv, hd), v.view(b, t, nkv, hd)
    out = attend(q, k, v, cache.k[layer], cache.v[layer], write, slot_ids, attn_len, mask)
    return attn.wo(out.view(b * t, s.q_size))


class Audio8TTSModel(nn.Module):
    """Slow AR (token + codebook embeddings, ``layers``, ``norm``, tied head) and fast AR (``fast_*``)."""

    def __init__(self, config: Audio8TalkerConfig, rope_dtype: torch.dtype = RELEASED_ROPE_DTYPE) -> None:
        super().__init__()
        c = config
        self.config = c
        self.embeddings = nn.Embedding(c.vocab_size, c.dim)
        # One table for all codebooks at a stride of codebook_size, even for the 1024-entry residual ones.
        self.codebook_embeddings = nn.Embedding(c.num_codebooks * c.codebook_size, c.dim)
        self.layers = nn.ModuleList(Block(c.slow) for _ in range(c.n_layer))
        self.norm = RMSNorm(c.dim, eps=c.norm_eps)
        self.fast_project_in: nn.Module
        if c.has_fast_project_in:
            self.fast_project_in = nn.Linear(c.dim, c.fast_dim)
        else:
            self.fast_project_in = nn.Identity()  # absent from the released checkpoint (dim == fast_dim)
        self.fast_embeddings = nn.Embedding(c.codebook_size, c.fast_dim)
        self.fast_layers = nn.ModuleList(Block(c.fast) for _ in range(c.n_fast_layer))
        self.fast_norm = RMSNorm(c.fast_dim, eps=c.norm_eps)
        self.fast_output = nn.Linear(c.fast_dim, c.codebook_size, bias=False)
        # Buffers derived from the config or the weights: not persistent, so strict loading never sees them
        # (a checkpoint's ``*freqs_cis`` buffers are dropped by the loader).
        self.rope_dtype = rope_dtype
        self.register_buffer("rope", rope_table(c.max_seq_len, c.head_dim, c.rope_base, rope_dtype), False)
        fast_rope = rope_table(c.num_codebooks, c.fast_head_dim, c.rope_base, rope_dtype)
        self.register_buffer("fast_rope", fast_rope, persistent=False)
        offsets = torch.arange(c.num_codebooks, dtype=torch.int64) * c.codebook_size
        self.register_buffer("codebook_offsets", offsets, persistent=False)
        # The compact LM head: the tied embedding rows of the semantic range, then <|im_end|>. Only these
        # 4097 of 155776 rows can be sampled (the reference masks the rest), so computing just them turns a
        # 0.14 GMAC head into 0.004. Filled from the weights by ``refresh_head`` (the loader calls it).
        self.register_buffer("head_weight", torch.zeros(c.head_rows, c.dim), persistent=False)

    @property
    def device(self) -> torch.device:
        return self.embeddings.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embeddings.weight.dtype

    @property
    def hidden_size(self) -> int:
        return self.config.dim

    @torch.no_grad()
    def refresh_head(self) -> None:
        """Slice the compact head out of ``embeddings`` (call after any change of the weights)."""
        c, w = self.config, self.embeddings.weight
        rows = torch.cat(
            (w[c.semantic_begin_id : c.semantic_end_id + 1], w[c.eos_token_id : c.eos_token_id + 1])
        )
        self.head_weight.copy_(rows)

    # -- slow AR ---------------------------------------------------------------------------------------------
    def embed(self, ids: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        """``ids [...]`` with ``codes [..., Q]`` -> ``[..., dim]``: the token embedding, plus the sum of the Q
        codebook embeddings where the token is semantic (no rescale; zero elsewhere)."""
        c = self.config
        tok = self.embeddings(ids)
        cb = self.codebook_embeddings(codes.clamp(0, c.codebook_size - 1) + self.codebook_offsets)
        semantic = (ids >= c.semantic_begin_id) & (ids <= c.semantic_end_id)
        return tok + cb.sum(dim=-2).masked_fill(~semantic.unsqueeze(-1), 0.0)

    def slow(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVPool,
        slot_ids: torch.Tensor | None = None,
        attn_len: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The slow AR over input embeddings ``x [B, T, dim]``: ``(post-norm, pre-norm)`` hidden states."""
        n = cache.max_len if attn_len is None else attn_len
        return run_stack(
            self.layers, self.norm, self.config.slow, x, positions, self.rope, cache, slot_ids, n
        )

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        cache: KVPool,
        slot_ids: torch.Tensor | None = None,
        attn_len: int | None = None,
    ) -> torch.Tensor:
        """Post-norm slow-AR hidden states ``[B, T, dim]`` (the prefill runner's call shape)."""
        return self.slow(x, positions, cache, slot_ids, attn_len)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Compact logits ``[..., codebook_size + 1]``: semantic code i at index i, <|im_end|> last."""
        return F.linear(hidden, self.head_weight)

    # -- fast AR ---------------------------------------------------------------------------------------------
    def fast_start(self, normed: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """Position 0 of the fast AR from the slow AR's output (post-norm with ``norm_fastlayer_input``)."""
        return self.fast_project_in(normed if self.config.norm_fastlayer_input else residual)

    def fast(self, x: torch.Tensor, positions: torch.Tensor, cache: KVPool, attn_len: int) -> torch.Tensor:
        """Fast-AR rows ``x [B, T, fast_dim]`` at ``positions [B, T]`` (0..Q-1) over the frame-local cache
        (rows ``0..B-1``); returns ``fast_norm`` of the output."""
        f = self.config.fast
        return run_stack(
            self.fast_layers, self.fast_norm, f, x, positions, self.fast_rope, cache, None, attn_len
        )[0]

    def fast_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.fast_output(hidden)

    # -- caches ----------------------------------------------------------------------------------------------
    def allocate_kv(self, num_slots: int, max_len: int) -> KVPool:
        if max_len > self.config.max_seq_len:
            raise ValueError(f"max_len {max_len} exceeds the model's max_seq_len {self.config.max_seq_len}")
        return allocate_pool(self.config.slow, num_slots, max_len, self.device, self.dtype)

    def allocate_fast_kv(self, batch: int) -> KVPool:
        """The fast AR's frame-local cache: ``num_codebooks`` positions per row, rewritten every frame."""
        return allocate_pool(self.config.fast, batch, self.config.num_codebooks, self.device, self.dtype)

    def kv_bytes_per_token(self) -> int:
        s = self.config.slow
        return kv_bytes_per_token(s.n_layer, s.n_local_heads, s.head_dim, self.dtype)
