"""Checks that need the loaded codec: its decoder window, codebook count and whether it keeps state.

These facts come from the checkpoint, so they cannot be checked by ``validate-config``; the codec stage calls
``check_codec_against_model`` right after loading and refuses to start on errors (``raise_for_errors``).
"""

from __future__ import annotations

from collections.abc import Sequence

from voxstage.config.deploy import DeployConfig
from voxstage.config.errors import ConfigError, Issue, Severity


def check_codec_against_model(
    cfg: DeployConfig, *, decoder_window_frames: int, stateful: bool, num_codebooks: int | None = None
) -> list[Issue]:
    """Errors and warnings for the stream's chunk settings against the loaded codec.

    ``decoder_window_frames`` is how many past frames the decoder can attend to (Qwen3-TTS 72, Audio8 128);
    ``stateful`` says whether the codec carries per-stream state (conv history and KV ring) across chunks or
    decodes each chunk afresh with ``codec_left_context_frames`` of overlap that is cropped afterwards.
    """
    if decoder_window_frames < 0:
        raise ValueError(f"decoder_window_frames must be >= 0, got {decoder_window_frames}")
    name = cfg.stream_connector_name or "<none>"
    loc = ("connectors", name, "extra")
    left = cfg.stream.codec_left_context_frames
    steady = cfg.stream.codec_chunk_frames
    out: list[Issue] = []

    def note(key: str, message: str, severity: Severity) -> None:
        out.append(Issue(loc=(*loc, key), message=message, source=cfg.source, severity=severity))

    if stateful:
        # The state already holds the full window, so the key can only restate it; a different value is a
        # misunderstanding worth flagging but cannot hurt the output.
        if left and left != decoder_window_frames:
            note(
                "codec_left_context_frames",
                f"is {left} but has no effect: this codec is stateful and carries its own "
                f"{decoder_window_frames}-frame history across chunks (set it to 0 or "
                f"{decoder_window_frames}, or set codec_decode: overlap_crop to decode each chunk behind "
                f"{left} frames of context instead)",
                "warning",
            )
    elif decoder_window_frames > 0 and left == 0:
        note(
            "codec_left_context_frames",
            "must be > 0 for this stateless codec: without overlap every chunk is decoded as if the stream "
            f"started there (decoder window {decoder_window_frames} frames)",
            "error",
        )
    elif left < decoder_window_frames:
        note(
            "codec_left_context_frames",
            f"is {left}, below the decoder window of {decoder_window_frames} frames: chunk seams will differ "
            "from an offline decode",
            "warning",
        )

    window = steady if stateful else left + steady
    if num_codebooks is not None:
        codec = cfg.codec
        tokens = num_codebooks * window
        if tokens > codec.batched_token_budget:
            out.append(
                Issue(
                    loc=("stages", cfg.stages.index(codec), "max_num_batched_tokens"),
                    message=f"is {codec.batched_token_budget}, but one steady chunk is {num_codebooks} "
                    f"codebooks x {window} frames = {tokens} codec tokens and a chunk is never split",
                    source=cfg.source,
                )
            )
    sizes = cfg.stream.decode_cudagraph_capture_sizes
    if sizes and not cfg.codec.enforce_eager and window > sizes[-1]:
        note(
            "decode_cudagraph_capture_sizes",
            f"largest bucket is {sizes[-1]} frames but a steady chunk decodes {window}: those run eager",
            "warning",
        )
    return out


def raise_for_errors(issues: Sequence[Issue]) -> list[Issue]:
    """Raise ``ConfigError`` if any issue is an error; otherwise return the warnings."""
    errors = [issue for issue in issues if issue.severity == "error"]
    if errors:
        raise ConfigError(errors)
    return [issue for issue in issues if issue.severity == "warning"]
