"""The in-process reference for the parity tests: the same request through TalkerEngine + CodecEngine."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from tests.integration.stagekit import MODEL, Reference

TEXT = "hello world, this is a test"
TEXT_HEAD, TEXT_TAIL = "hello world,", [" this is", " a test"]  # the same text, streamed


def in_process_reference(
    cache: Path,
    frames: int,
    seed: int,
    *,
    model: str = MODEL,
    reference: Reference | None = None,
    stream_text: Sequence[str] = (),
) -> np.ndarray:
    """The same request through TalkerEngine + CodecEngine in this process (deploy sampling written out).
    With ``reference`` (a Base model): the codec's encoders make the x-vector (and ICL codes), the talker
    conditions on them, and the codec decodes the reference codes first and drops their audio."""
    from services.codec.engine import ChunkSchedule, CodecEngine
    from services.codec.models import load_codec
    from services.talker.engine import EngineConfig, TalkerEngine, TalkerRequest
    from services.talker.models import load_talker
    from services.talker.sampling import SamplingParams
    from services.talker.spec import SpeechSpec
    from voxstage.presets import resolve_model

    torch.set_num_threads(1)
    source = resolve_model(model, cache=cache)
    runtime = load_codec(source, max_streams=1)
    ref_codes = xvec = None
    if reference is not None:
        xvec = runtime.speaker_embedding(reference.pcm, reference.sample_rate)
        if reference.text:
            ref_codes = runtime.encode_reference(reference.pcm, reference.sample_rate)
    adapter, _ = load_talker(source)
    talker = TalkerEngine(
        adapter, EngineConfig(max_num_seqs=1, max_model_len=4096, max_num_batched_tokens=512)
    )
    # deploy/qwen3_tts.yaml: temperature 0.9, top_k 50, repetition_penalty 1.05 (top_p from the checkpoint);
    # subtalker: do_sample, 0.9, 50, 1.0; min_tokens unset (0).
    main = SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=1.0, repetition_penalty=1.05)
    sub = SamplingParams(do_sample=True, temperature=0.9, top_k=50, top_p=1.0)
    first = TEXT if not stream_text else TEXT_HEAD
    spec = SpeechSpec(
        text=first,
        text_complete=not stream_text,
        voice=None if reference is not None else "ryan",
        speaker_embedding=xvec,
        ref_text=reference.text or None if reference is not None else None,
        ref_codes=ref_codes,
    )
    talker.submit(
        TalkerRequest("ref", spec, seed=seed, sampling=main, subtalker=sub, max_frames=frames, min_frames=0)
    )
    codes = []
    for delta in stream_text:  # what the talker does with deltas after a flush
        talker.push_text("ref", delta, complete=False)
    if stream_text:
        talker.push_text("ref", "", complete=True)
    while talker.has_work():
        codes += [o.codes for o in talker.step() if o.codes.shape[0]]
    codec = CodecEngine(runtime.decoder, max_streams=1, schedule=ChunkSchedule(1, 25), num_groups=16)
    codec.open("ref", prefix=ref_codes)
    codec.push("ref", np.concatenate(codes))
    codec.finish("ref")
    pcm = []
    while codec.has_work():
        pcm += [o.pcm for o in codec.step()]
    return np.concatenate(pcm)
