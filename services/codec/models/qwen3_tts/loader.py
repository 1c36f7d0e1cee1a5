"""Build the 12 Hz decoder from a released checkpoint directory, or with seeded random weights.

A Qwen3-TTS repo ships the codec as ``speech_tokenizer/{config.json,model.safetensors}``; the safetensors
file holds ``encoder.*`` (the encoder's, loaded elsewhere) and ``decoder.*`` keys, which must match this
module tree exactly. The RVQ codebooks and their projections stay in fp32 whatever ``dtype`` is asked for:
the EMA division and the 16-way sum are precision-sensitive and the tables are small next to the convs.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from services.codec.stream_layers import ConvNeXtBlock
from voxstage.checkpoint import CheckpointError, load_state_dict_strict, read_json
from voxstage.nn.layers import RMSNorm

from .checkpoint_io import read_prefixed_tensors
from .config import DecoderConfigError, Qwen3DecoderConfig, decoder_config_from_tokenizer_json
from .decoder import EuclideanCodebook, Qwen3TokenizerDecoder
from .layers import LayerScale, SnakeBeta, TransformerLayer

DECODER_PREFIX = "decoder."


def load_decoder_config(checkpoint_dir: str | Path) -> Qwen3DecoderConfig:
    """Read ``speech_tokenizer/config.json`` under a Qwen3-TTS checkpoint (or a bare tokenizer) directory."""
    path = _tokenizer_dir(Path(checkpoint_dir)) / "config.json"
    try:
        return decoder_config_from_tokenizer_json(read_json(path))
    except DecoderConfigError as exc:
        raise CheckpointError(f"{path}: {exc}") from exc


def _tokenizer_dir(checkpoint_dir: Path) -> Path:
    """Accept the model repo root (holding ``speech_tokenizer/``) or the tokenizer folder itself."""
    nested = checkpoint_dir / "speech_tokenizer"
    return nested if nested.is_dir() else checkpoint_dir


def _place(
    model: Qwen3TokenizerDecoder, device: str | torch.device, dtype: torch.dtype
) -> Qwen3TokenizerDecoder:
    # Cast child by child: casting the whole model and then the quantizer back to fp32 would round the
    # codebooks through ``dtype`` on the way.
    for name, child in model.named_children():
        child.to(device=device, dtype=torch.float32 if name == "quantizer" else dtype)
    for module in model.modules():
        if isinstance(module, TransformerLayer):
            module.fuse_projections()
    return model.eval().requires_grad_(False)


def load_qwen3_tts_decoder(
    checkpoint_dir: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Qwen3TokenizerDecoder:
    """Strictly load ``decoder.*`` of ``speech_tokenizer/model.safetensors``; any missing, unexpected or
    mis-shaped key raises :class:`CheckpointError` naming it."""
    tok_dir = _tokenizer_dir(Path(checkpoint_dir))
    config = load_decoder_config(checkpoint_dir)
    weights_path = tok_dir / "model.safetensors"
    # Only the decoder's keys are read: the encoder's belong to another module (and another process).
    tensors = read_prefixed_tensors(weights_path, DECODER_PREFIX)
    state = {k[len(DECODER_PREFIX) :]: v for k, v in tensors.items()}
    if not state:
        raise CheckpointError(f"{weights_path} holds no '{DECODER_PREFIX}*' keys")
    with torch.device("meta"):
        model = Qwen3TokenizerDecoder(config)
    model.to_empty(device="cpu")
    load_state_dict_strict(model, state, source=f"{weights_path} ({DECODER_PREFIX}*)")
    return _place(model, device, dtype)


def random_init(
    config: Qwen3DecoderConfig,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Qwen3TokenizerDecoder:
    """Seeded random decoder whose every part matters to the output (for tests, demos, benchmarks).

    The reference init decodes to silence (codebooks are zero) and nearly bypasses the ConvNeXt blocks
    (gain 1e-6), so a test built on it could not see a broken codebook or ConvNeXt state. Here the codebooks,
    gains, layer scales and SnakeBeta parameters are drawn too, and the conv/linear weights are scaled so
    activations stay O(1) through the 4 upsampling blocks and the waveform sits well inside clamp(-1, 1).
    """
    gen = torch.Generator().manual_seed(seed)
    model = Qwen3TokenizerDecoder(config)
    with torch.no_grad():
        for name, module in model.named_modules():
            _init_module(name, module, gen)
        # Keep the waveform mostly unclipped: clipping would hide differences from the tests.
        final = model.decoder[-1].conv
        final.weight.mul_(0.08)
    return _place(model, device, dtype)


def _uniform(t: torch.Tensor, bound: float, gen: torch.Generator) -> None:
    t.copy_((torch.rand(t.shape, generator=gen) * 2 - 1) * bound)


def _init_module(name: str, module: nn.Module, gen: torch.Generator) -> None:
    if isinstance(module, EuclideanCodebook):
        module.embedding_sum.copy_(torch.randn(module.embedding_sum.shape, generator=gen) * 0.25)
        # Usage counts far from 1 so a lookup that forgot the division would be caught.
        module.cluster_usage.copy_(torch.rand(module.cluster_usage.shape, generator=gen) * 3 + 0.5)
        module.embedding_sum.mul_(module.cluster_usage[:, None])
    elif isinstance(module, SnakeBeta):
        module.alpha.copy_(torch.randn(module.alpha.shape, generator=gen) * 0.2)
        module.beta.copy_(torch.randn(module.beta.shape, generator=gen) * 0.2)
    elif isinstance(module, LayerScale):
        module.scale.copy_(torch.rand(module.scale.shape, generator=gen) * 0.4 + 0.1)
    elif isinstance(module, ConvNeXtBlock):
        module.gamma.copy_(torch.rand(module.gamma.shape, generator=gen) * 0.4 + 0.1)
    elif isinstance(module, nn.Conv1d | nn.ConvTranspose1d | nn.Linear):
        weight = module.weight
        if isinstance(module, nn.ConvTranspose1d):
            # Each output sample of a (k=2s, s) transposed conv sums k/s taps per input channel.
            fan_in = weight.shape[0] * math.ceil(weight.shape[2] / module.stride[0])
        else:
            fan_in = weight[0].numel()
        # Residual branches start small so the 3 residual units per block do not compound the gain.
        gain = 0.3 if name.endswith(("conv2.conv", "down_proj", "o_proj")) else 1.0
        _uniform(weight, gain * math.sqrt(3.0 / fan_in), gen)
        if module.bias is not None:
            _uniform(module.bias, 0.1, gen)
    elif isinstance(module, nn.LayerNorm | RMSNorm):
        module.weight.copy_(1 + 0.1 * torch.randn(module.weight.shape, generator=gen))
        if getattr(module, "bias", None) is not None:
            _uniform(module.bias, 0.1, gen)
