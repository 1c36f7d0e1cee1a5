"""Inner half of ``make_golden_qwen3_tts.py``: runs inside the throwaway reference venv.

Order matters for honesty: weights are drawn and written as fixture files first, a checkpoint is
materialized from those files with ``tests/golden.py`` (the code the tests use), and every reference output
comes from a model loaded out of that checkpoint by the reference's own ``from_pretrained``.

Inputs are searched, not hand-picked: waveform seeds are tried in order until every encoder code is a clear
nearest-centroid pick (``MIN_CENTROID_GAP``), then for each generation case prompt seeds are tried until the
greedy decode is far from ties (``MIN_MARGIN``) and ends the way the case wants (24 frames, or EOS after at
least 20). The search runs on the full random text-embedding table; the fixture then zeroes every row no
chosen prompt uses, which cannot change those prompts' outputs (asserted by re-running them).
"""

from __future__ import annotations

import importlib.metadata
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from golden_qwen3_tts_cases import (
    CaseSpec,
    GenCase,
    make_case,
    reference_waveform,
    run_decode,
    run_generate,
    run_speaker_encoder,
    run_tokenizer_encode,
)
from golden_qwen3_tts_reference import (
    DECODER_OUT_GAIN_LOG2,
    EOS_ROW_GAIN,
    Reference,
    load_all,
    load_golden_module,
    write_json,
)
from golden_qwen3_tts_weights import SEED, write_npz

MIN_MARGIN = 1e-3  # every greedy pick beats the runner-up by at least this (logit units)
MIN_CENTROID_GAP = 2e-4  # each encoder code's centroid beats the runner-up by this (fp32 noise ~1e-6)
MAX_PROMPT_TRIES = 400
MIN_FRAMES = 20
DECODE_FRAMES = (36, 96)  # the second one exceeds the 72-frame window, so the window is exercised
TOLERANCES: dict[str, float | str] = {
    "prefill_embeds": 1e-5,
    "talker_logits": 1e-4,
    "codec_decode_wav": 1e-4,
    "mel": 1e-4,
    "x_vector": 1e-4,
    "generated_codes": "exact",
    "encoder_codes": "exact",
}
SPECS = (
    CaseSpec(
        "gen_custom_voice",
        "custom_voice",
        10,
        "english",
        speaker="ryan",
        max_new_tokens=64,
        expect_eos=True,
        notes="CustomVoice, preset speaker, non-streaming text (the wrapper's default); stops on EOS",
    ),
    CaseSpec(
        "gen_custom_voice_instruct",
        "custom_voice",
        9,
        "chinese",
        speaker="eric",
        instruct_len=7,
        notes="CustomVoice + instruct; eric has spk_is_dialect=sichuan_dialect, so language chinese is "
        "replaced by codec id 2062",
    ),
    CaseSpec(
        "gen_voice_design",
        "voice_design",
        11,
        "auto",
        instruct_len=9,
        notes="VoiceDesign: instruct only, language auto (nothink prefix), non-streaming",
    ),
    CaseSpec(
        "gen_base_xvector",
        "base",
        12,
        "english",
        voice_clone="x_vector",
        non_streaming_mode=False,
        notes="Base x-vector only, streaming text (the generate_voice_clone default)",
    ),
    CaseSpec(
        "gen_base_icl",
        "base",
        16,
        "english",
        voice_clone="icl",
        ref_text_len=12,
        non_streaming_mode=False,
        notes="Base ICL: x-vector + ref_text + ref codes, streaming text; ref+text outrun the ref codes, "
        "so the excess text becomes the trailing stream",
    ),
)


def _voice(
    models: dict, tokenizer: Any, wav: np.ndarray
) -> tuple[dict, dict, dict[str, torch.Tensor], float]:
    speaker = run_speaker_encoder(models["base"], wav)
    encoded, nearest_gap = run_tokenizer_encode(tokenizer, wav)
    voice = {
        "x_vector": torch.from_numpy(speaker["x_vector"]),
        "ref_code": torch.from_numpy(encoded["codes"].T.copy()),
    }
    return speaker, encoded, voice, nearest_gap


def _pick_waveform(tokenizer: Any) -> tuple[int, np.ndarray]:
    """First waveform seed whose 16 encoder codes are all clear nearest-centroid picks."""
    for wav_seed in range(MAX_PROMPT_TRIES):
        wav = reference_waveform(SEED, wav_seed)
        if run_tokenizer_encode(tokenizer, wav)[1] >= MIN_CENTROID_GAP:
            print(f"reference waveform: seed {wav_seed}", flush=True)
            return wav_seed, wav
    raise RuntimeError(f"no waveform seed below {MAX_PROMPT_TRIES} gives clear encoder codes")


def _acceptable(spec: CaseSpec, meta: dict[str, Any]) -> bool:
    if min(meta["min_greedy_margin"].values()) < MIN_MARGIN:
        return False
    if spec.expect_eos:
        return meta["stopped_on_eos"] and meta["num_frames"] >= MIN_FRAMES
    return not meta["stopped_on_eos"] and meta["num_frames"] == spec.max_new_tokens - 1


def _search_prompts(models: dict, voice: dict[str, torch.Tensor]) -> list[tuple[GenCase, np.ndarray]]:
    chosen = []
    for spec in SPECS:
        for prompt_seed in range(MAX_PROMPT_TRIES):
            case = make_case(spec, SEED, prompt_seed)
            data, meta = run_generate(models[case.variant], case, voice)
            if _acceptable(spec, meta):
                print(f"{spec.name}: prompt seed {prompt_seed}, {meta['num_frames']} frames", flush=True)
                chosen.append((case, data["codes"]))
                break
        else:
            raise RuntimeError(f"no prompt seed below {MAX_PROMPT_TRIES} satisfies {spec.name}")
    return chosen


def build_fixtures(out: Path, command: str) -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    import librosa
    import transformers

    golden = load_golden_module()
    ref = Reference()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        ref.write(tmp / "full", golden)
        models, tokenizer = load_all(tmp / "full", tmp / "ckpt_full", golden, ref.key_sets)
        wav_seed, wav = _pick_waveform(tokenizer)
        chosen = _search_prompts(models, _voice(models, tokenizer, wav)[2])
    used = sorted(
        {i for c, _ in chosen for ids in (c.input_ids, c.instruct_ids or [], c.ref_ids or []) for i in ids}
    )
    ref.keep_text_rows(used)
    ref.write(out, golden)

    arrays: dict[str, np.ndarray] = {}
    metas: dict[str, dict[str, Any]] = {}

    def record(name: str, meta: dict[str, Any], data: dict[str, np.ndarray]) -> None:
        metas[name] = {**meta, "arrays": sorted(data)}
        arrays.update({f"{name}.{k}": np.ascontiguousarray(v) for k, v in data.items()})

    with tempfile.TemporaryDirectory() as tmp_name:
        models, tokenizer = load_all(out, Path(tmp_name), golden, ref.key_sets)
        speaker, encoded, voice, nearest_gap = _voice(models, tokenizer, wav)
        mel_meta = {
            "n_fft": 1024,
            "hop": 256,
            "win": 1024,
            "n_mels": 128,
            "fmin": 0,
            "fmax": 12000,
            "center": False,
            "pad": "reflect, (n_fft - hop) // 2 each side",
            "magnitude": "sqrt(re^2 + im^2 + 1e-9)",
            "log": "ln(clamp(mel, min=1e-5))",
            "filterbank": "librosa.filters.mel (slaney), float32",
        }
        record(
            "speaker_encoder", {"kind": "speaker_encoder", "variant": "base", "mel_params": mel_meta}, speaker
        )
        record(
            "tokenizer_encode",
            {
                "kind": "tokenizer_encode",
                "num_frames": int(encoded["codes"].shape[1]),
                "frames_rule": "ceil(len(wav) / 1920)",
                "wav_seed": wav_seed,
                # smallest (2nd nearest - nearest) centroid distance over the 16 kept
                # quantizers: how close any code came to flipping
                "min_nearest_centroid_gap": nearest_gap,
            },
            encoded,
        )
        for case, searched_codes in chosen:
            data, meta = run_generate(models[case.variant], case, voice)
            assert np.array_equal(data["codes"], searched_codes), (
                f"{case.name}: zeroing text rows changed codes"
            )
            logits = data.pop("prefill_logits")
            if case.name == "gen_custom_voice":
                record(
                    "talker_logits",
                    {
                        "kind": "talker_logits",
                        "variant": case.variant,
                        "source": "prefill of gen_custom_voice",
                    },
                    {
                        "prefill_embeds": data["prefill_embeds"],
                        "logits": logits,
                        "logits_last": data["prefill_logits_last"],
                    },
                )
            record(case.name, meta, data)
        rng = np.random.default_rng([SEED, 11])
        for frames in DECODE_FRAMES:
            decoded = run_decode(tokenizer.model, rng.integers(0, 2048, size=(16, frames)).astype(np.int64))
            record(
                f"codec_decode_{frames}",
                {
                    "kind": "codec_decode",
                    "num_frames": frames,
                    "path": "Qwen3TTSTokenizerV2Decoder.forward, one pass (not chunked_decode)",
                    "clamped_fraction": float(np.mean(np.abs(decoded["wav"]) >= 1.0)),
                },
                decoded,
            )

    write_npz(str(out / golden.CASES_NPZ), arrays)
    write_json(
        out / golden.CASES_JSON,
        {
            "format_version": 1,
            "command": command,
            "reference": {
                "qwen_tts": importlib.metadata.version("qwen-tts"),
                "transformers": transformers.__version__,
                "torch": torch.__version__,
                "numpy": np.__version__,
                "librosa": librosa.__version__,
            },
            "seed": SEED,
            "dtype": "float32",
            "attn_implementation": "eager",
            "torch_threads": 1,
            "tolerances": TOLERANCES,
            "min_greedy_margin": MIN_MARGIN,
            "min_nearest_centroid_gap": MIN_CENTROID_GAP,
            "weight_adjustments": {
                "eos_row_gain": EOS_ROW_GAIN,
                "decoder_final_conv_gain": 2.0**DECODER_OUT_GAIN_LOG2,
                "text_embedding_rows_kept": used + ref.text_specials,
                "encoder_acoustic_codebooks_zeroed_from": ref.st_config.encoder_valid_num_quantizers - 1,
            },
            "cases": metas,
        },
    )
    total = 0
    for path in sorted(out.iterdir()):
        total += path.stat().st_size
        print(f"{path.stat().st_size:>9}  {path.name}")
    print(f"{total:>9}  total")
    assert total < 5_000_000, f"fixtures take {total} bytes, over the 5 MB budget"
