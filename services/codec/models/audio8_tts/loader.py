"""Build the Audio8 codec from a checkpoint directory (strictly), or with seeded random weights; save one.

Geometry of a real checkpoint (:func:`config_from_checkpoint`):

* from the top-level ``config.json``: ``codec_post_n_layer``, ``codec_post_n_head``,
  ``codec_post_n_local_heads``, ``codec_post_intermediate_size`` (released defaults 8 / 16 / 8 / 1216 when a
  field is absent, as the reference constructor has them), ``codec_sample_rate`` (44100) and
  ``codec_frame_size`` (2048, checked against the strides), ``codec_filename`` (``codec.pth``);
* from tensor shapes: latent width (``out_proj``), codebook sizes/width and residual count (``codebook``),
  post-module head_dim (``wqkv`` rows / (heads + 2 kv heads)), pre-module and encoder-transformer layer
  counts, heads (assuming the reference's head_dim 64) and ffn (``w1``), re-sampling factors (re-sampler conv
  kernels), decoder width (first conv) and strides (transposed kernels / 2), encoder width (first conv) and
  strides (strided kernels / 2). The attention windows (128, 512) are reference constants.

Loading is strict: after the reference's unwrapping and weight-norm folding (``checkpoint_io``), any missing,
unexpected or mis-shaped key raises ``CheckpointError`` naming it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from voxstage.checkpoint import CheckpointError, load_state_dict_strict, read_json

from .checkpoint_io import read_codec_state, released_layout
from .codec import Audio8Codec
from .config import Audio8CodecConfig, Audio8ConfigError, TransformerGeometry
from .transformer import FeedForward, WindowTransformer

CODEC_FILENAME = "codec.pth"
# The reference builds its pre-module and encoder transformer with head_dim 64 (heads = dim // 64).
FIXED_HEAD_DIM = 64


def _field(top: Mapping[str, Any], key: str, default: int) -> int:
    value = top.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f"config.json: {key} must be a positive integer, got {value!r}")
    return value


def _check_frame_size(top: Mapping[str, Any], cfg: Audio8CodecConfig, where: str, implied: str) -> None:
    """``codec_frame_size`` (optional in ``config.json``) must be the frame the geometry gives: the talker
    and the stream protocol size their chunks by it."""
    frame = _field(top, "codec_frame_size", cfg.samples_per_frame)
    if frame != cfg.samples_per_frame:
        raise CheckpointError(
            f"{where} codec_frame_size {frame} != {cfg.samples_per_frame} samples per frame {implied}"
        )


def config_from_json(top: Mapping[str, Any], base: Audio8CodecConfig | None = None) -> Audio8CodecConfig:
    """``base`` (default: released) with the post-module fields of ``config.json`` applied; the geometry of
    a size-true random-init preset, which has no ``codec.pth`` to read shapes from."""
    base = base or Audio8CodecConfig.released()
    post = base.post
    heads = _field(top, "codec_post_n_head", post.heads)
    try:
        cfg = base.with_post(
            layers=_field(top, "codec_post_n_layer", post.layers),
            heads=heads,
            kv_heads=_field(top, "codec_post_n_local_heads", post.kv_heads),
            ffn=_field(top, "codec_post_intermediate_size", post.ffn),
            head_dim=post.head_dim if heads == post.heads else None,
        )
        cfg = replace(cfg, sample_rate=_field(top, "codec_sample_rate", base.sample_rate))
    except Audio8ConfigError as exc:
        raise CheckpointError(f"config.json: {exc}") from exc
    _check_frame_size(top, cfg, "config.json:", "of the codec")
    return cfg


def _indices(state: Mapping[str, torch.Tensor], pattern: str) -> list[int]:
    found = {int(m.group(1)) for k in state if (m := re.fullmatch(pattern, k))}
    return sorted(found)


def _shape(state: Mapping[str, torch.Tensor], key: str, source: str) -> tuple[int, ...]:
    if key not in state:
        raise CheckpointError(f"{source}: missing key {key} (needed to derive the codec geometry)")
    return tuple(state[key].shape)


def _fixed_head_transformer(
    state: Mapping[str, torch.Tensor], path: str, dim: int, window: int, source: str
) -> TransformerGeometry:
    esc = re.escape(path)
    layers = _indices(state, esc + r"\.layers\.(\d+)\.attention\.wqkv\.weight")
    heads = kv = max(1, dim // FIXED_HEAD_DIM)
    ffn = 3 * dim
    if layers:
        heads = _shape(state, f"{path}.layers.0.attention.wo.weight", source)[1] // FIXED_HEAD_DIM
        rows = _shape(state, f"{path}.layers.0.attention.wqkv.weight", source)[0]
        kv = (rows - heads * FIXED_HEAD_DIM) // (2 * FIXED_HEAD_DIM)
        ffn = _shape(state, f"{path}.layers.0.feed_forward.w1.weight", source)[0]
    return TransformerGeometry(
        layers=len(layers), dim=dim, heads=heads, kv_heads=max(kv, 1), head_dim=FIXED_HEAD_DIM, ffn=ffn,
        window=window,
    )  # fmt: skip


def config_from_checkpoint(
    top: Mapping[str, Any], state: Mapping[str, torch.Tensor], *, source: str
) -> Audio8CodecConfig:
    """The geometry of a (folded) ``codec.pth`` state with its top-level ``config.json``."""
    s = state
    latent = _shape(s, "quantizer.quantizer.quantizers.0.out_proj.weight", source)[0]
    sem_size, cb_dim = _shape(s, "quantizer.semantic_quantizer.quantizers.0.codebook.weight", source)
    res_size = _shape(s, "quantizer.quantizer.quantizers.0.codebook.weight", source)[0]
    residual = _indices(s, r"quantizer\.quantizer\.quantizers\.(\d+)\.codebook\.weight")
    post_layers = _field(top, "codec_post_n_layer", 8)
    heads = _field(top, "codec_post_n_head", 16)
    kv = _field(top, "codec_post_n_local_heads", 8)
    rows = _shape(s, "quantizer.post_module.layers.0.attention.wqkv.weight", source)[0]
    if rows % (heads + 2 * kv):
        raise CheckpointError(
            f"{source}: post_module wqkv has {rows} rows, not a multiple of codec_post_n_head + 2 x "
            f"codec_post_n_local_heads = {heads + 2 * kv} (config.json disagrees with the weights)"
        )
    post = TransformerGeometry(
        layers=post_layers, dim=latent, heads=heads, kv_heads=kv, head_dim=rows // (heads + 2 * kv),
        ffn=_field(top, "codec_post_intermediate_size", 1216), window=128,
    )  # fmt: skip
    down = _indices(s, r"quantizer\.downsample\.(\d+)\.0\.conv\.weight")
    factors = tuple(_shape(s, f"quantizer.downsample.{i}.0.conv.weight", source)[-1] for i in down)
    dec_blocks = _indices(s, r"decoder\.model\.(\d+)\.block\.1\.conv\.weight")
    dec_strides = tuple(
        _shape(s, f"decoder.model.{i}.block.1.conv.weight", source)[-1] // 2 for i in dec_blocks
    )
    enc_blocks = _indices(s, r"encoder\.block\.(\d+)\.block\.4\.conv\.weight")
    enc_strides = tuple(
        _shape(s, f"encoder.block.{i}.block.4.conv.weight", source)[-1] // 2 for i in enc_blocks
    )
    enc_channels = _shape(s, "encoder.block.0.conv.weight", source)[0]
    enc_out = enc_channels * 2 ** len(enc_strides)
    last = f"encoder.block.{enc_blocks[-1]}.block.5" if enc_blocks else "encoder.block.0.block.5"
    try:
        cfg = Audio8CodecConfig(
            sample_rate=_field(top, "codec_sample_rate", 44100),
            latent_dim=latent,
            codebook_dim=cb_dim,
            semantic_codebook_size=sem_size,
            residual_codebook_size=res_size,
            num_residual=len(residual),
            post=post,
            pre=_fixed_head_transformer(s, "quantizer.pre_module", latent, 128, source),
            resample_factors=factors,
            decoder_channels=_shape(s, "decoder.model.0.conv.weight", source)[0],
            decoder_strides=dec_strides,
            encoder_channels=enc_channels,
            encoder_strides=enc_strides,
            encoder_transformer=_fixed_head_transformer(s, last, enc_out, 512, source),
        )
    except Audio8ConfigError as exc:
        raise CheckpointError(f"{source}: inconsistent codec geometry: {exc}") from exc
    _check_frame_size(top, cfg, f"{source}: config.json", "implied by the weights' strides")
    return cfg


def _place(model: Audio8Codec, device: str | torch.device, dtype: torch.dtype) -> Audio8Codec:
    # Module by module: casting everything and then the codebooks back to fp32 would round them through
    # ``dtype`` on the way. Codebooks and VQ projections stay fp32 (small; the nearest-neighbour search
    # and the 10-way sum are precision-sensitive).
    fp32 = {model.quantizer.semantic_quantizer, model.quantizer.quantizer}
    for part in (model.encoder, model.decoder, *model.quantizer.children()):
        part.to(device=device, dtype=torch.float32 if part in fp32 else dtype)
    for module in model.modules():
        if isinstance(module, FeedForward):
            module.fuse()  # gate and up as one GEMM (the move replaced their parameters)
    return model.eval().requires_grad_(False)


def load_audio8_codec(
    path: str | Path, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> Audio8Codec:
    """Strictly load ``<path>/codec.pth`` (or ``codec_filename``) using ``<path>/config.json``."""
    path = Path(path)
    top = read_json(path / "config.json")
    name = top.get("codec_filename", CODEC_FILENAME)
    if not isinstance(name, str) or not name or "/" in name:
        raise CheckpointError(f"{path / 'config.json'}: codec_filename must be a file name, got {name!r}")
    weights = path / name
    state = read_codec_state(weights)
    config = config_from_checkpoint(top, state, source=str(weights))
    with torch.device("meta"):
        model = Audio8Codec(config)
    load_state_dict_strict(model, state, source=str(weights), assign=True)
    return _place(model, device, dtype)


def random_init(
    config: Audio8CodecConfig,
    seed: int = 0,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Audio8Codec:
    """Seeded random codec whose every part matters to the output (tests, tiny presets, size-true runs).

    Weights are drawn on ``device`` from one generator, module by module in a fixed order, so a
    (config, seed, device) triple always gives the same model. Unlike the reference init (ConvNeXt gains
    1e-6 and layer scales 0.01 nearly bypass those blocks; Snake alpha is 1 everywhere), gains, layer scales,
    alphas and norms are drawn too, and weights are scaled to keep activations O(1) through the stacks and
    the waveform mostly inside tanh's linear range.
    """
    device = torch.device(device)
    with torch.device("meta"):
        model = Audio8Codec(config)
    model.to_empty(device=device)
    gen = torch.Generator(device=device).manual_seed(seed)
    final_conv = model.decoder.model[-2]
    with torch.no_grad():
        for name, module in model.named_modules():
            for pname, param in module.named_parameters(recurse=False):
                param.copy_(_draw(f"{name}.{pname}", module, param, gen, final=module is final_conv))
    return _place(model, device, dtype)


def _draw(
    key: str, module: nn.Module, param: torch.Tensor, gen: torch.Generator, final: bool
) -> torch.Tensor:
    shape, device = tuple(param.shape), param.device

    def rand() -> torch.Tensor:
        return torch.rand(shape, generator=gen, device=device)

    def randn() -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=device)

    name = key.rsplit(".", 1)[-1]
    if name == "alpha":  # Snake: away from 0, where 1/alpha blows up
        return 0.5 + rand()
    if name == "gamma":  # ConvNeXt gain and transformer layer scales
        return 0.1 + 0.4 * rand()
    if isinstance(module, nn.Embedding):
        return randn()
    if isinstance(module, nn.LayerNorm) or "norm" in key.rsplit(".", 2)[-2]:
        return 1 + 0.1 * randn() if name == "weight" else 0.05 * randn()
    if name == "bias":
        return 0.05 * randn()
    if isinstance(module, nn.ConvTranspose1d):  # [in, out, k]: each output sums in * k / stride taps
        fan_in = shape[0] * math.ceil(shape[2] / module.stride[0])
    else:
        fan_in = math.prod(shape[1:])
    gain = 1.0
    if key.endswith("block.3.conv.weight") or key.endswith("out_proj.weight"):
        gain = 0.25  # residual-unit output convs / 10 summed codebook vectors: keep the sums O(1)
    elif isinstance(module, nn.ConvTranspose1d):
        gain = 0.7  # Snake adds up to 1/alpha per layer; shrink so 4 upsampling blocks do not compound it
    if final:
        gain = 0.1
    return randn() * (gain / math.sqrt(fan_in))


def save_codec_checkpoint(model: Audio8Codec, path: str | Path) -> Path:
    """Write ``model`` as ``codec.pth`` in the released layout (``path``: a directory, or a ``.pth`` file);
    returns the file written. The geometry travels in ``config.json`` (``presets.codec_config_fields``)."""
    path = Path(path)
    out = path if path.suffix == ".pth" else path / CODEC_FILENAME
    out.parent.mkdir(parents=True, exist_ok=True)
    transformers = {
        name: (module.geom.head_dim, module.geom.window)
        for name, module in model.named_modules()
        if isinstance(module, WindowTransformer)
    }
    torch.save(released_layout(model.state_dict(), transformers), out)
    return out
