"""Reference module trees, fixture-file writing and checkpoint loading for the Qwen3-TTS golden fixtures.

Imported by ``golden_qwen3_tts_build.py`` inside the throwaway reference venv (qwen_tts, transformers 4.57.3).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
from golden_qwen3_tts_weights import (
    GENERATION_CONFIG,
    draw_state,
    model_config_kwargs,
    speech_tokenizer_config_kwargs,
    write_npz,
)

REPO = Path(__file__).resolve().parents[2]
VARIANTS = ("custom_voice", "voice_design", "base")
EOS_ID = 2150
# Knobs applied after the random draw; each is documented in the fixture README.
EOS_ROW_GAIN = 1.5  # codec_head row 2150 (EOS) scaled up so EOS can win within tens of frames
DECODER_OUT_GAIN_LOG2 = -4  # final conv of the codec decoder x 1/16, so clamp(-1, 1) rarely bites


def load_golden_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("voxstage_tests_golden", REPO / "tests" / "golden.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _clean_config(data: dict[str, Any], generic: dict[str, Any]) -> dict[str, Any]:
    """Drop the generic PretrainedConfig fields still at their defaults; model fields are all kept."""
    keep = {"model_type", "architectures", "dtype", "transformers_version"}
    out: dict[str, Any] = {}
    for key, value in data.items():
        if key.startswith("_") or (key in generic and key not in keep and value == generic[key]):
            continue
        if key == "model_type" and not value:
            # Qwen3TTSSpeakerEncoderConfig takes no **kwargs: its empty model_type must not be written back.
            continue
        if isinstance(value, dict) and "model_type" in value:
            value = _clean_config(value, generic)
        out[key] = value
    return out


def config_json(config: Any, architecture: str) -> dict[str, Any]:
    from transformers import PretrainedConfig

    config.architectures = [architecture]
    data = _clean_config(config.to_dict(), PretrainedConfig().to_dict())
    data["dtype"] = "float32"
    return data


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1) + "\n")


def _transposed_prefixes(module: torch.nn.Module) -> list[str]:
    return [f"{name}." for name, m in module.named_modules() if isinstance(m, torch.nn.ConvTranspose1d)]


def _manifest_part(
    file: str, state: dict[str, tuple[np.ndarray, int]], variants: dict[str, list[str]] | None
) -> dict[str, Any]:
    tensors = {k: {"shape": list(q.shape), "dtype": "float32", "exp": int(e)} for k, (q, e) in state.items()}
    part: dict[str, Any] = {"file": file, "tensors": tensors}
    if variants is not None:
        part["variants"] = variants
    return part


class Reference:
    """The reference module trees (for key names/shapes) and the fixture-file writer."""

    def __init__(self) -> None:
        from qwen_tts.core.models import Qwen3TTSConfig, Qwen3TTSForConditionalGeneration
        from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (
            Qwen3TTSTokenizerV2Config,
        )
        from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model

        self.configs = {v: Qwen3TTSConfig(**model_config_kwargs(v)) for v in VARIANTS}
        self.key_sets: dict[str, list[str]] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        transposed: list[str] = []
        for variant, config in self.configs.items():
            tree = Qwen3TTSForConditionalGeneration(config)
            self.key_sets[variant] = list(tree.state_dict())
            self.shapes.update({k: tuple(v.shape) for k, v in tree.state_dict().items()})
            transposed += _transposed_prefixes(tree)
        self.st_config = Qwen3TTSTokenizerV2Config(**speech_tokenizer_config_kwargs())
        st_tree = Qwen3TTSTokenizerV2Model(self.st_config)
        assert all(v.dtype == torch.float32 for v in st_tree.state_dict().values())
        self.st_shapes = {k: tuple(v.shape) for k, v in st_tree.state_dict().items()}
        self.model_state = draw_state(self.shapes, transposed)
        self.st_state = draw_state(self.st_shapes, _transposed_prefixes(st_tree))
        self._adjust()
        base = self.configs["base"]
        self.text_specials = [base.tts_pad_token_id, base.tts_bos_token_id, base.tts_eos_token_id]

    def _adjust(self) -> None:
        q, exp = self.model_state["talker.codec_head.weight"]
        q = q.copy()
        q[EOS_ID] = np.clip(np.rint(q[EOS_ID].astype(np.float64) * EOS_ROW_GAIN), -127, 127).astype(np.int8)
        self.model_state["talker.codec_head.weight"] = (q, exp)
        prefix = "encoder.quantizer.acoustic_residual_vector_quantizer.layers."
        first_unused = self.st_config.encoder_valid_num_quantizers - 1
        for key, (q, exp) in list(self.st_state.items()):
            # Acoustic codebooks past the 16 codes the tokenizer keeps never reach an output: zeroed so they
            # cost nothing to store (the reference still runs them).
            if (
                key.startswith(prefix)
                and key.endswith("embed_sum")
                and int(key[len(prefix) :].split(".")[0]) >= first_unused
            ):
                self.st_state[key] = (np.zeros_like(q), exp)
        q, exp = self.st_state["decoder.decoder.6.conv.weight"]
        self.st_state["decoder.decoder.6.conv.weight"] = (q, exp + DECODER_OUT_GAIN_LOG2)

    def keep_text_rows(self, used: list[int]) -> None:
        q, exp = self.model_state["talker.model.text_embedding.weight"]
        keep = np.zeros(q.shape[0], dtype=bool)
        keep[used + self.text_specials] = True
        q = q.copy()
        q[~keep] = 0  # rows no prompt uses: zero, so the 151936-row table costs almost nothing to store
        self.model_state["talker.model.text_embedding.weight"] = (q, exp)

    def write(self, out: Path, golden: ModuleType) -> None:
        from transformers import EncodecFeatureExtractor

        out.mkdir(parents=True, exist_ok=True)
        write_npz(str(out / "weights_model.npz"), {k: q for k, (q, _) in self.model_state.items()})
        write_npz(str(out / "weights_speech_tokenizer.npz"), {k: q for k, (q, _) in self.st_state.items()})
        write_json(
            out / golden.WEIGHTS_JSON,
            {
                "format": "value = int8 q (.npz member named by the key) * 2**exp; exact in fp32 and bf16",
                "model": _manifest_part("weights_model.npz", self.model_state, self.key_sets),
                "speech_tokenizer": _manifest_part("weights_speech_tokenizer.npz", self.st_state, None),
            },
        )
        for variant, config in self.configs.items():
            write_json(
                out / golden.model_config_name(variant),
                config_json(config, "Qwen3TTSForConditionalGeneration"),
            )
        write_json(
            out / golden.SPEECH_TOKENIZER_CONFIG, config_json(self.st_config, "Qwen3TTSTokenizerV2Model")
        )
        write_json(out / golden.GENERATION_CONFIG, GENERATION_CONFIG)
        extractor = EncodecFeatureExtractor(
            feature_size=1,
            sampling_rate=24000,
            padding_value=0.0,
            return_attention_mask=True,
            padding_side="right",
        )
        write_json(out / golden.PREPROCESSOR_CONFIG, json.loads(extractor.to_json_string()))
        golden._load_npz.cache_clear()


def load_speech_tokenizer(path: Path) -> Any:
    """The reference ``Qwen3TTSTokenizer`` wrapper, assembled as its ``from_pretrained`` does, except that
    eager attention is set on the sub-configs: its ``from_pretrained`` does not pass the choice down, so the
    Mimi encoder and the decoder transformer would silently run SDPA."""
    from qwen_tts import Qwen3TTSTokenizer
    from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Config
    from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Model
    from transformers import AutoFeatureExtractor

    config = Qwen3TTSTokenizerV2Config.from_pretrained(str(path))
    for sub in (config, config.encoder_config, config.decoder_config):
        sub._attn_implementation = "eager"
    wrapper = Qwen3TTSTokenizer()
    wrapper.feature_extractor = AutoFeatureExtractor.from_pretrained(str(path))
    wrapper.model = Qwen3TTSTokenizerV2Model.from_pretrained(
        str(path), config=config, dtype=torch.float32
    ).eval()
    wrapper.config = wrapper.model.config
    wrapper.device = wrapper.model.device
    return wrapper


def load_all(root: Path, tmp: Path, golden: ModuleType, key_sets: dict[str, list[str]]) -> tuple[dict, Any]:
    """Materialize every variant from the fixture files in ``root`` and load it with the reference."""
    from qwen_tts.core.models import Qwen3TTSForConditionalGeneration

    models = {}
    for variant in VARIANTS:
        ckpt = golden.materialize_checkpoint(variant, tmp / variant, root=root)
        model = Qwen3TTSForConditionalGeneration.from_pretrained(
            str(ckpt), attn_implementation="eager", dtype=torch.float32, local_files_only=True
        ).eval()
        expected = golden.load_state_dict("model", variant, root=root)
        loaded = model.state_dict()
        assert list(loaded) == key_sets[variant], f"{variant}: reference key set changed on reload"
        assert all(torch.equal(loaded[k], expected[k]) for k in expected), f"{variant}: weights differ"
        assert model.talker.code_predictor.config._attn_implementation == "eager"
        models[variant] = model
    tokenizer = load_speech_tokenizer(tmp / "base" / "speech_tokenizer")
    expected = golden.load_state_dict("speech_tokenizer", root=root)
    assert all(torch.equal(tokenizer.model.state_dict()[k], v) for k, v in expected.items()), "codec differs"
    return models, tokenizer
