"""Runs the reference ``qwen-tts`` 0.1.1 models on fixed inputs and collects the golden cases.

Imported by ``make_golden_qwen3_tts.py --inner`` inside the throwaway venv (torch, transformers 4.57.3,
qwen_tts, librosa). Every model call is the reference's own code path; this file only builds inputs,
captures what the reference computed (via hooks, never by re-implementing it) and returns numpy arrays.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

ROLE = [151644, 77091, 198]  # "<|im_start|>assistant\n" in the Qwen2 vocab
ASSISTANT_TAIL = [151645, 198, *ROLE]  # "<|im_end|>\n<|im_start|>assistant\n"
USER = [151644, 872, 198]  # "<|im_start|>user\n"
END = [151645, 198]  # "<|im_end|>\n"
SAMPLE_RATE = 24000


def token_run(rng: np.random.Generator, n: int) -> list[int]:
    # Arbitrary ordinary-vocab ids: the reference takes ids, so no text tokenizer is involved.
    return [int(x) for x in rng.integers(1000, 150000, size=n)]


def assistant_ids(tokens: list[int]) -> list[int]:
    return ROLE + tokens + ASSISTANT_TAIL


def instruct_ids(tokens: list[int]) -> list[int]:
    return USER + tokens + END


def ref_text_ids(tokens: list[int]) -> list[int]:
    return ROLE + tokens + END


def reference_waveform(seed: int, wav_seed: int, seconds: float = 1.7) -> np.ndarray:
    """Seeded tones with a slow envelope plus noise, on the int16 PCM grid (exact in fp32)."""
    rng = np.random.default_rng([seed, 99, wav_seed])
    n = int(round(seconds * SAMPLE_RATE))
    t = np.arange(n) / SAMPLE_RATE
    wav = np.zeros(n)
    for freq, amp in zip(rng.uniform(110, 3000, size=4), rng.uniform(0.05, 0.2, size=4), strict=True):
        wav += amp * np.sin(2 * np.pi * freq * t + rng.uniform(0, 2 * np.pi))
    wav *= 0.6 + 0.4 * np.sin(2 * np.pi * 1.3 * t)
    wav += rng.normal(0, 0.02, size=n)
    pcm = np.clip(np.rint(wav * 32768), -32768, 32767)
    return (pcm / 32768.0).astype(np.float32)


@dataclass(frozen=True)
class CaseSpec:
    """What a generation case is; its token ids are drawn by :func:`make_case` from a prompt seed."""

    name: str
    variant: str
    text_len: int
    languages: str
    speaker: str | None = None
    instruct_len: int = 0
    ref_text_len: int = 0
    voice_clone: str | None = None
    non_streaming_mode: bool = True
    max_new_tokens: int = 25  # -> 24 frames: the last sampled group-0 token never gets its other codes
    expect_eos: bool = False
    notes: str = ""


def make_case(spec: CaseSpec, seed: int, prompt_seed: int) -> GenCase:
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode()), prompt_seed])
    text = token_run(rng, spec.text_len)
    instruct = instruct_ids(token_run(rng, spec.instruct_len)) if spec.instruct_len else None
    ref = ref_text_ids(token_run(rng, spec.ref_text_len)) if spec.ref_text_len else None
    return GenCase(
        name=spec.name,
        variant=spec.variant,
        input_ids=assistant_ids(text),
        languages=spec.languages,
        speaker=spec.speaker,
        instruct_ids=instruct,
        ref_ids=ref,
        voice_clone=spec.voice_clone,
        non_streaming_mode=spec.non_streaming_mode,
        max_new_tokens=spec.max_new_tokens,
        notes=spec.notes,
        prompt_seed=prompt_seed,
    )


@dataclass
class GenCase:
    """One ``Qwen3TTSForConditionalGeneration.generate`` call with greedy talker and code predictor."""

    name: str
    variant: str
    input_ids: list[int]
    languages: str
    speaker: str | None = None
    instruct_ids: list[int] | None = None
    ref_ids: list[int] | None = None
    voice_clone: str | None = None  # None, "x_vector" or "icl"
    non_streaming_mode: bool = True
    max_new_tokens: int = 25
    repetition_penalty: float = 1.05
    notes: str = ""
    prompt_seed: int = 0


class PrefillCapture:
    """Records what the talker's first forward call (the prefill) received and produced."""

    def __init__(self, talker: torch.nn.Module) -> None:
        self.inputs: dict[str, torch.Tensor] = {}
        self.logits: torch.Tensor | None = None
        self.calls = 0
        self._handles = [
            talker.register_forward_pre_hook(self._pre, with_kwargs=True),
            talker.register_forward_hook(self._post, with_kwargs=True),
        ]

    def _pre(self, _module: torch.nn.Module, _args: tuple, kwargs: dict[str, Any]) -> None:
        self.calls += 1
        if self.calls == 1:
            for key in ("inputs_embeds", "attention_mask", "trailing_text_hidden", "tts_pad_embed"):
                value = kwargs.get(key)
                if value is not None:
                    self.inputs[key] = value.detach().clone()

    def _post(self, _module: torch.nn.Module, _args: tuple, _kwargs: dict[str, Any], output: Any) -> None:
        if self.calls == 1 and self.logits is None:
            self.logits = output.logits.detach().clone()

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


def _greedy_margin(scores: torch.Tensor) -> float:
    top = torch.topk(scores[0].float(), 2).values
    return float(top[0] - top[1])


def generation_kwargs(case: GenCase) -> dict[str, Any]:
    """Sampling arguments passed to the reference; ``min_new_tokens`` is fixed at 2 inside it."""
    return {
        "max_new_tokens": case.max_new_tokens,
        "do_sample": False,
        "top_k": 50,
        "top_p": 1.0,
        "temperature": 0.9,
        "subtalker_dosample": False,
        "subtalker_top_k": 50,
        "subtalker_top_p": 1.0,
        "subtalker_temperature": 0.9,
        "repetition_penalty": case.repetition_penalty,
    }


def run_generate(
    model: Any, case: GenCase, voice: dict[str, torch.Tensor] | None
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Run one case; ``voice`` holds ``x_vector`` [H] and ``ref_code`` [T_ref, 16] for Base cases."""
    ids = torch.tensor([case.input_ids], dtype=torch.long)
    kwargs: dict[str, Any] = {
        "input_ids": [ids],
        "languages": [case.languages],
        "non_streaming_mode": case.non_streaming_mode,
        **generation_kwargs(case),
    }
    if case.speaker is not None:
        kwargs["speakers"] = [case.speaker]
    if case.instruct_ids is not None:
        kwargs["instruct_ids"] = [torch.tensor([case.instruct_ids], dtype=torch.long)]
    if case.voice_clone is not None:
        assert voice is not None
        icl = case.voice_clone == "icl"
        kwargs["voice_clone_prompt"] = {
            "ref_code": [voice["ref_code"] if icl else None],
            "ref_spk_embedding": [voice["x_vector"]],
            "x_vector_only_mode": [not icl],
            "icl_mode": [icl],
        }
        if icl:
            kwargs["ref_ids"] = [torch.tensor([case.ref_ids], dtype=torch.long)]
    capture = PrefillCapture(model.talker)
    sampled: list[torch.Tensor] = []
    margins: dict[str, list[float]] = {"group0": [], "code_predictor": []}
    talker_generate = model.talker.generate
    predictor_generate = model.talker.code_predictor.generate

    def recording_generate(*args: Any, **kw: Any) -> Any:
        result = talker_generate(*args, **{**kw, "output_scores": True})
        sampled.append(result.sequences.detach().clone())
        margins["group0"] += [_greedy_margin(score) for score in result.scores]
        return result

    def recording_predictor(*args: Any, **kw: Any) -> Any:
        result = predictor_generate(*args, **{**kw, "output_scores": True})
        margins["code_predictor"] += [_greedy_margin(score) for score in result.scores]
        return result

    # Instance attributes shadow the methods for this call only; asking for the processed scores changes
    # nothing in the decoding and tells how far each greedy pick was from a tie.
    model.talker.generate = recording_generate
    model.talker.code_predictor.generate = recording_predictor
    try:
        codes_list, hidden_list = model.generate(**kwargs)
    finally:
        capture.close()
        del model.talker.generate
        del model.talker.code_predictor.generate
    assert capture.logits is not None
    codes = codes_list[0].to(torch.int64).numpy()
    arrays = {
        "codes": codes,
        "talker_hidden": hidden_list[0].float().numpy(),
        "prefill_embeds": capture.inputs["inputs_embeds"][0].numpy(),
        "trailing_text_hidden": capture.inputs["trailing_text_hidden"][0].numpy(),
        "tts_pad_embed": capture.inputs["tts_pad_embed"].reshape(-1).numpy(),
        "prefill_logits": capture.logits[0].numpy(),
        "prefill_logits_last": capture.logits[0, -1].numpy(),
        "input_ids": np.asarray(case.input_ids, dtype=np.int64),
    }
    if case.instruct_ids is not None:
        arrays["instruct_ids"] = np.asarray(case.instruct_ids, dtype=np.int64)
    if case.ref_ids is not None:
        arrays["ref_ids"] = np.asarray(case.ref_ids, dtype=np.int64)
    if case.voice_clone is not None:
        assert voice is not None
        arrays["x_vector"] = voice["x_vector"].numpy()
        if case.voice_clone == "icl":
            arrays["ref_code"] = voice["ref_code"].to(torch.int64).numpy()
    eos = model.config.talker_config.codec_eos_token_id
    group0 = sampled[0][0].to(torch.int64).numpy()  # every group-0 token the talker sampled, EOS included
    arrays["sampled_group0"] = group0
    meta = {
        "kind": "generate",
        "variant": case.variant,
        "args": {
            "input_ids": "array input_ids [1, T] (stored 1-D)",
            "instruct_ids": None if case.instruct_ids is None else "array instruct_ids",
            "ref_ids": None if case.ref_ids is None else "array ref_ids",
            "languages": [case.languages],
            "speakers": None if case.speaker is None else [case.speaker],
            "voice_clone": case.voice_clone,
            "non_streaming_mode": case.non_streaming_mode,
            "min_new_tokens": 2,
            **generation_kwargs(case),
        },
        "num_frames": int(codes.shape[0]),
        "num_sampled_group0": int(group0.shape[0]),
        "talker_forward_calls": int(capture.calls),
        "stopped_on_eos": bool(group0.shape[0] > 0 and group0[-1] == eos),
        # Smallest gap between the best and second-best processed score over all greedy picks: a port
        # whose logits differ by less than this cannot flip a code.
        "min_greedy_margin": {k: float(min(v)) for k, v in margins.items()},
        "eos_token_id": int(eos),
        "prefill_length": int(arrays["prefill_embeds"].shape[0]),
        "prompt_seed": case.prompt_seed,
        "notes": case.notes,
    }
    return arrays, meta


def run_speaker_encoder(model: Any, wav: np.ndarray) -> dict[str, np.ndarray]:
    from librosa.filters import mel as librosa_mel_fn
    from qwen_tts.core.models.modeling_qwen3_tts import mel_spectrogram

    mel = mel_spectrogram(
        torch.from_numpy(wav).unsqueeze(0),
        n_fft=1024,
        num_mels=128,
        sampling_rate=SAMPLE_RATE,
        hop_size=256,
        win_size=1024,
        fmin=0,
        fmax=12000,
    ).transpose(1, 2)
    x_vector = model.extract_speaker_embedding(wav, SAMPLE_RATE)
    # The public entry point must equal the encoder applied to the mel we store.
    with torch.inference_mode():
        direct = model.speaker_encoder(mel)[0]
    assert torch.equal(direct, x_vector), "extract_speaker_embedding differs from speaker_encoder(mel)"
    basis = librosa_mel_fn(sr=SAMPLE_RATE, n_fft=1024, n_mels=128, fmin=0, fmax=12000)
    return {
        "wav": wav,
        "mel": mel[0].numpy(),
        "mel_basis": np.asarray(basis, dtype=np.float32),
        "x_vector": x_vector.float().numpy(),
    }


def run_tokenizer_encode(tokenizer: Any, wav: np.ndarray) -> tuple[dict[str, np.ndarray], float]:
    """``tokenizer`` is the reference ``Qwen3TTSTokenizer`` wrapper (feature extractor + model)."""
    latents: list[torch.Tensor] = []

    def keep_latent(_m: torch.nn.Module, _a: tuple, out: torch.Tensor) -> None:
        latents.append(out.detach().clone())

    handle = tokenizer.model.encoder.downsample.register_forward_hook(keep_latent)
    quantizer = tokenizer.model.encoder.quantizer
    kept = tokenizer.model.encoder_valid_num_quantizers
    layers = [
        *quantizer.semantic_residual_vector_quantizer.layers,
        *quantizer.acoustic_residual_vector_quantizer.layers,
    ]
    gaps: list[float] = []
    for layer in layers[:kept]:
        _watch_nearest(layer.codebook, gaps)
    try:
        enc = tokenizer.encode(wav, sr=SAMPLE_RATE)
    finally:
        handle.remove()
        for layer in layers[:kept]:
            del layer.codebook.quantize
    codes_tq = enc.audio_codes[0].to(torch.int64)  # [T_ref, 16], the reference's layout
    arrays = {
        "wav": wav,
        "codes": codes_tq.T.contiguous().numpy(),
        "latent": latents[0][0].numpy(),
    }
    return arrays, min(gaps)


def _watch_nearest(codebook: torch.nn.Module, gaps: list[float]) -> None:
    """Shadow ``codebook.quantize`` on the instance to note how far each nearest centroid beat the next one
    (a diagnostic; the reference's own quantize still picks the codes)."""
    original = codebook.quantize

    def quantize(hidden: torch.Tensor) -> torch.Tensor:
        dists = torch.cdist(hidden[None].float(), codebook.embed[None].float(), p=2)[0]
        two = torch.topk(dists, 2, dim=-1, largest=False).values
        gaps.append(float((two[:, 1] - two[:, 0]).min()))
        return original(hidden)

    codebook.quantize = quantize


def run_decode(codec: Any, codes: np.ndarray) -> dict[str, np.ndarray]:
    """Single forward pass of ``Qwen3TTSTokenizerV2Decoder`` (not the 300/25 chunked wrapper)."""
    decoder = codec.decoder
    captured: dict[str, torch.Tensor] = {}

    # Forward hooks must return None: a returned value would replace the module's output.
    def keep_transformer(_m: torch.nn.Module, _a: tuple, out: Any) -> None:
        captured["transformer_out"] = out.last_hidden_state.detach().clone()

    def keep_upsampled(_m: torch.nn.Module, _a: tuple, out: torch.Tensor) -> None:
        captured["upsampled"] = out.detach().clone()

    hooks = [
        decoder.pre_transformer.register_forward_hook(keep_transformer),
        decoder.upsample[-1][-1].register_forward_hook(keep_upsampled),  # last ConvNeXt block
    ]
    batch = torch.from_numpy(codes)[None]
    try:
        with torch.inference_mode():
            wav = decoder(batch)
            quantized = decoder.quantizer.decode(batch)
    finally:
        for hook in hooks:
            hook.remove()
    return {
        "codes": codes,
        "quantized": quantized[0].numpy(),
        "transformer_out": captured["transformer_out"][0].numpy(),
        "upsampled": captured["upsampled"][0].numpy(),
        "wav": wav[0, 0].numpy(),
    }
