#!/usr/bin/env python3
"""Build the Audio8-TTS (arktts) golden fixtures with ``transformers`` as the structural reference.

    python tests/golden_builders/make_golden_audio8_tts.py [--venv DIR] [--out tests/fixtures/audio8_tts]

No reference package exists for Audio8 (its modeling code is HF remote code), so parity is structural
(models.md §2.4): the slow AR equals ``transformers.Qwen2Model`` (q/k/v bias, o without) and the fast AR
``LlamaModel(attention_bias=False)``, once the q and k rows of every head (weights and biases) are permuted
from the interleaved (GPT-J) rotary layout to NeoX order ``[0, 2, 4, ..., 1, 3, 5, ...]``. The embedding
sum, the compact head and the frame loop around them are written out here in plain torch.

Creates (or reuses) a throwaway venv with ``transformers==4.57.3`` (never a voxstage dependency), then
re-runs itself there with ``--inner``: weights come from ``tests/golden_audio8_tts.py`` (a pure function of
each key), the cases run in fp32 with eager attention, and ``cases.json`` / ``cases.npz`` are written (reruns
give identical bytes). transformers keeps its RoPE table in fp32, unlike the released model's bf16 table, so
the test compares a voxstage model built with ``rope_dtype=torch.float32``.

Cases:
* ``prompt``: a 20-position input (text ids, then 8 semantic positions with codes, then text): the slow
  AR's post-norm hidden states at every position and its compact logits (4096 semantic + <|im_end|>);
* ``fast``: the fast AR teacher-forced from the prompt's last hidden state with given codes: logits of
  codebooks 1..9 (positions 1..9);
* ``greedy``: 8 frames generated greedily (argmax; no RAS, no EOS ban) by the reference loop.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_venv  # noqa: E402  (a sibling script, importable once the folder is on the path)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = Path("/tmp/voxstage-golden-arktts-venv")
DEFAULT_OUT = REPO / "tests" / "fixtures" / "audio8_tts"
REQUIREMENTS = [
    "torch==2.13.0",
    "transformers==4.57.3",
    "huggingface_hub==0.36.2",
    "tokenizers==0.22.2",
    "safetensors==0.8.0",
    "numpy==2.4.6",
]
PROMPT_TEXT_HEAD, PROMPT_SEMANTIC, PROMPT_TEXT_TAIL = 6, 8, 6
GREEDY_FRAMES = 8
RESIDUAL_CARD = 1024  # codebooks 1..9 of the codec hold 1024 entries


def main(argv: list[str] | None = None) -> int:
    return golden_venv.run_in_venv(
        argv,
        script=__file__,
        doc=__doc__ or "",
        default_venv=DEFAULT_VENV,
        default_out=DEFAULT_OUT,
        requirements=REQUIREMENTS,
        no_deps=[],
        inner=lambda out, command: build_fixtures(out, command=command),
    )


def _golden() -> Any:
    path = REPO / "tests" / "golden_audio8_tts.py"
    spec = importlib.util.spec_from_file_location("golden_audio8_tts", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def neox_rows(w: Any, heads: int, head_dim: int) -> Any:
    """Rows of q or k (weight ``[heads * hd, in]`` or bias ``[heads * hd]``), each head's interleaved pairs
    reordered to rotate-half order: (2i, 2i+1) -> (i, i + hd/2)."""
    import torch

    perm = torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
    shaped = w.reshape(heads, head_dim, *w.shape[1:])
    return shaped[:, perm].reshape(w.shape).contiguous()


def _stack_state(state: dict[str, Any], prefix: str, n: int, heads: int, kv: int, hd: int) -> dict[str, Any]:
    """voxstage/DualAR keys of one stack -> transformers ``layers.N.*`` keys (q/k permuted)."""
    out: dict[str, Any] = {}
    q, k = heads * hd, kv * hd
    for i in range(n):
        src, dst = f"{prefix}.{i}", f"layers.{i}"
        w = state[f"{src}.attention.wqkv.weight"]
        out[f"{dst}.self_attn.q_proj.weight"] = neox_rows(w[:q], heads, hd)
        out[f"{dst}.self_attn.k_proj.weight"] = neox_rows(w[q : q + k], kv, hd)
        out[f"{dst}.self_attn.v_proj.weight"] = w[q + k :].clone()
        bias = state.get(f"{src}.attention.wqkv.bias")
        if bias is not None:
            out[f"{dst}.self_attn.q_proj.bias"] = neox_rows(bias[:q], heads, hd)
            out[f"{dst}.self_attn.k_proj.bias"] = neox_rows(bias[q : q + k], kv, hd)
            out[f"{dst}.self_attn.v_proj.bias"] = bias[q + k :].clone()
        out[f"{dst}.self_attn.o_proj.weight"] = state[f"{src}.attention.wo.weight"]
        out[f"{dst}.mlp.gate_proj.weight"] = state[f"{src}.feed_forward.w1.weight"]
        out[f"{dst}.mlp.up_proj.weight"] = state[f"{src}.feed_forward.w3.weight"]
        out[f"{dst}.mlp.down_proj.weight"] = state[f"{src}.feed_forward.w2.weight"]
        out[f"{dst}.input_layernorm.weight"] = state[f"{src}.attention_norm.weight"]
        out[f"{dst}.post_attention_layernorm.weight"] = state[f"{src}.ffn_norm.weight"]
    return out


def _load(model: Any, mapped: dict[str, Any]) -> Any:
    # embed_tokens stays unused (inputs_embeds are passed): the only key the mapping does not provide.
    missing, unexpected = model.load_state_dict(mapped, strict=False)
    assert list(missing) == ["embed_tokens.weight"] and not unexpected, (missing, unexpected)
    return model.eval()


def reference_models(c: dict[str, Any], state: dict[str, Any]) -> tuple[Any, Any]:
    from transformers import LlamaConfig, LlamaModel, Qwen2Config, Qwen2Model

    common = {
        "vocab_size": 16,
        "hidden_act": "silu",
        "rope_theta": c["rope_base"],
        "rms_norm_eps": c["norm_eps"],
    }
    slow_cfg = Qwen2Config(
        hidden_size=c["dim"], intermediate_size=c["intermediate_size"], num_hidden_layers=c["n_layer"],
        num_attention_heads=c["n_head"], num_key_value_heads=c["n_local_heads"], head_dim=c["head_dim"],
        max_position_embeddings=c["max_seq_len"], use_sliding_window=False, tie_word_embeddings=False,
        attn_implementation="eager", **common,
    )  # fmt: skip
    fast_cfg = LlamaConfig(
        hidden_size=c["fast_dim"], intermediate_size=c["fast_intermediate_size"],
        num_hidden_layers=c["n_fast_layer"], num_attention_heads=c["fast_n_head"],
        num_key_value_heads=c["fast_n_local_heads"], head_dim=c["fast_head_dim"],
        max_position_embeddings=c["num_codebooks"], attention_bias=False, mlp_bias=False,
        attn_implementation="eager", **common,
    )  # fmt: skip
    slow = _stack_state(state, "layers", c["n_layer"], c["n_head"], c["n_local_heads"], c["head_dim"])
    slow["norm.weight"] = state["norm.weight"]
    fast = _stack_state(
        state, "fast_layers", c["n_fast_layer"], c["fast_n_head"], c["fast_n_local_heads"], c["fast_head_dim"]
    )
    fast["norm.weight"] = state["fast_norm.weight"]
    return _load(Qwen2Model(slow_cfg), slow), _load(LlamaModel(fast_cfg), fast)


class Reference:
    """The DualAR frame loop around the transformers stacks, in plain torch (no KV cache: every call
    recomputes its whole sequence)."""

    def __init__(self, c: dict[str, Any], state: dict[str, Any]) -> None:
        import torch

        self.c, self.state = c, state
        self.slow, self.fast = reference_models(c, state)
        emb = state["embeddings.weight"]
        lo, hi, eos = c["semantic_begin_id"], c["semantic_end_id"], c["eos_token_id"]
        self.head = torch.cat((emb[lo : hi + 1], emb[eos : eos + 1]))

    def embed(self, ids: Any, codes: Any) -> Any:
        c, s = self.c, self.state
        offsets = (codes + c["codebook_size"] * self.torch.arange(c["num_codebooks"])).long()
        books = s["codebook_embeddings.weight"][offsets].sum(dim=1)  # [T, D]
        semantic = (ids >= c["semantic_begin_id"]) & (ids <= c["semantic_end_id"])
        books[~semantic] = 0
        return s["embeddings.weight"][ids] + books

    @property
    def torch(self) -> Any:
        import torch

        return torch

    def hidden(self, ids: Any, codes: Any) -> Any:
        """Post-norm slow-AR hidden states ``[T, D]``."""
        x = self.embed(ids, codes).unsqueeze(0)
        pos = self.torch.arange(x.shape[1]).unsqueeze(0)
        return self.slow(inputs_embeds=x, position_ids=pos).last_hidden_state[0]

    def fast_hidden(self, start: Any, prev_codes: list[int]) -> Any:
        """Fast-AR ``fast_norm`` outputs ``[1 + len(prev), D]`` for ``[start, E(prev_0), E(prev_1), ...]``."""
        emb = self.state["fast_embeddings.weight"][self.torch.tensor(prev_codes, dtype=self.torch.long)]
        x = self.torch.cat((start.unsqueeze(0), emb)).unsqueeze(0)
        pos = self.torch.arange(x.shape[1]).unsqueeze(0)
        return self.fast(inputs_embeds=x, position_ids=pos).last_hidden_state[0]

    def fast_logits(self, h: Any) -> Any:
        return h @ self.state["fast_output.weight"].T


def build_fixtures(out: Path, command: str) -> None:
    import numpy as np
    import torch
    import transformers
    from golden_qwen3_tts_weights import write_npz

    torch.manual_seed(0)
    g = _golden()
    c = g.golden_config()
    shapes = g.checkpoint_shapes(c)
    ref = Reference(c, g.make_state_dict(shapes))
    rng = np.random.default_rng(20260101)
    q = c["num_codebooks"]

    head_ids = rng.integers(0, c["pad_token_id"], PROMPT_TEXT_HEAD)
    frames = np.concatenate(
        (
            rng.integers(0, c["codebook_size"], (PROMPT_SEMANTIC, 1)),
            rng.integers(0, RESIDUAL_CARD, (PROMPT_SEMANTIC, q - 1)),
        ),
        axis=1,
    )
    tail_ids = rng.integers(0, c["pad_token_id"], PROMPT_TEXT_TAIL)
    ids = np.concatenate((head_ids, frames[:, 0] + c["semantic_begin_id"], tail_ids)).astype(np.int64)
    codes = np.zeros((ids.shape[0], q), np.int64)
    codes[PROMPT_TEXT_HEAD : PROMPT_TEXT_HEAD + PROMPT_SEMANTIC] = frames
    arrays: dict[str, np.ndarray] = {"prompt.ids": ids, "prompt.codes": codes}

    with torch.no_grad():
        hidden = ref.hidden(torch.from_numpy(ids), torch.from_numpy(codes))
        arrays["prompt.hidden"] = hidden.numpy()
        arrays["prompt.logits"] = (hidden @ ref.head.T).numpy()

        tf = np.concatenate(
            ([int(rng.integers(0, c["codebook_size"]))], rng.integers(0, RESIDUAL_CARD, q - 2))
        )
        fast = ref.fast_hidden(hidden[-1], [int(x) for x in tf])
        arrays["fast.codes"] = tf.astype(np.int64)  # code 0 (semantic) then codes 1..8 as fed
        arrays["fast.logits"] = ref.fast_logits(fast[1:]).numpy()  # codebooks 1..9

        seq_ids, seq_codes = torch.from_numpy(ids), torch.from_numpy(codes)
        made = []
        for _ in range(GREEDY_FRAMES):
            h = ref.hidden(seq_ids, seq_codes)[-1]
            index = int((h @ ref.head.T).argmax())
            if index == c["codebook_size"]:
                break  # <|im_end|>
            frame = [index]
            for _k in range(1, q):
                frame.append(int(ref.fast_logits(ref.fast_hidden(h, frame)[-1]).argmax()))
            made.append(frame)
            seq_ids = torch.cat((seq_ids, torch.tensor([index + c["semantic_begin_id"]])))
            seq_codes = torch.cat((seq_codes, torch.tensor([frame])))
        arrays["greedy.codes"] = np.asarray(made, np.int64).reshape(-1, q)

    doc = {
        "generator": command,
        "reference": {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]},
        "classes": {
            "slow": "Qwen2Model (q/k rows permuted to NeoX order)",
            "fast": "LlamaModel(attention_bias=False)",
        },
        "rope_table": "float32 (transformers); the released model stores it in bfloat16",
        "config": c,
        "shapes": shapes,
        "greedy": {"frames": GREEDY_FRAMES, "rule": "argmax, no RAS, no EOS ban"},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / g.CASES_JSON).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    write_npz(str(out / g.CASES_NPZ), arrays)
    print(f"wrote {out} ({len(made)} greedy frames)")


if __name__ == "__main__":
    sys.exit(main())
