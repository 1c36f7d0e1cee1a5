"""Per-request records of the load generator and their aggregates (one load level at a time)."""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.playback import Playback, pcm_arrivals, percentile, simulate_playback

FRAME_RATE_HZ = 12.5  # default: the Qwen3-TTS 12 Hz codec, one frame is 80 ms of audio (Audio8: 44100/2048)
PERCENTILES = (50, 90, 95, 99)


@dataclass
class Outcome:
    """What one request saw on the wire; times are ``time.perf_counter()`` seconds."""

    start: float  # just before the first request byte was handed to the transport
    ok: bool = False
    code: str = ""  # gRPC status name, HTTP_<status>, or a client-side reason (TIMEOUT, TRUNCATED)
    detail: str = ""
    reads: list[tuple[float, int]] = field(default_factory=list)  # (time, PCM bytes) as they arrived
    end: float | None = None  # last byte of the response
    sample_rate: int = 0
    bytes_per_sample: int = 2
    request_id: str = ""
    frames: int | None = None  # codec frames, from the server's summary when the API returns one
    server_ttfa_s: float | None = None  # the gateway's own TTFA (receipt to first audio byte sent)
    # LLM-rate mode (bench/llm_stream.py) only:
    text_done: float | None = None  # when the last text delta was handed to the transport
    send_lag_max_s: float | None = None  # worst lateness of a delta against its schedule
    segments: int | None = None  # segment_done responses received


@dataclass
class RequestRecord:
    index: int
    api: str
    prompt_id: int
    text_chars: int
    seed: int
    scheduled_s: float  # planned send time from the level's start
    sent_s: float  # actual send time from the level's start
    done_s: float  # when the client had the whole response (or gave up), from the level's start
    warmup: bool
    ok: bool
    code: str
    detail: str
    request_id: str = ""
    ttfa_s: float | None = None  # first playable sample, from the first request byte
    e2e_s: float | None = None  # last byte, from the first request byte
    audio_s: float | None = None
    rtf: float | None = None  # e2e_s / audio_s
    samples: int = 0
    chunks: int = 0
    frames: int | None = None
    length_ok: bool | None = None  # fixed-length mode: exactly frames x 80 ms of audio
    stalls: int = 0
    stall_total_s: float = 0.0
    stall_max_s: float = 0.0
    max_lag_s: float = 0.0
    first_stall_audio_s: float | None = None
    server_ttfa_s: float | None = None
    # LLM-rate mode: the last text delta's send time from the first (the request start), whether the first
    # playable sample came before it, the client's worst delta lateness, the sentences sent (flushes) and
    # the segments received (more than sentences when a take hit its frame budget mid-sentence).
    text_done_s: float | None = None
    audio_before_text_done: bool | None = None
    send_lag_max_s: float | None = None
    sentences: int | None = None
    segments: int | None = None


def build_record(
    out: Outcome,
    *,
    index: int,
    api: str,
    prompt_id: int,
    text: str,
    seed: int,
    level_start: float,
    done: float,
    scheduled_s: float,
    warmup: bool,
    fixed_frames: int | None,
    tolerance_s: float = 0.0,
    frame_rate_hz: float = FRAME_RATE_HZ,
    sentences: int | None = None,
) -> RequestRecord:
    """``sentences`` (LLM-rate mode) makes ``fixed_frames`` a per-segment budget: the clip must then be that
    many frames times the segments the server reported (every take runs to its budget: EOS is disabled)."""
    rec = RequestRecord(
        index=index,
        api=api,
        prompt_id=prompt_id,
        text_chars=len(text),
        seed=seed,
        scheduled_s=scheduled_s,
        sent_s=out.start - level_start,
        done_s=done - level_start,
        warmup=warmup,
        ok=out.ok,
        code=out.code or ("OK" if out.ok else "UNKNOWN"),
        detail=out.detail,
        request_id=out.request_id,
        frames=out.frames,
        server_ttfa_s=out.server_ttfa_s,
        text_done_s=None if out.text_done is None else out.text_done - out.start,
        send_lag_max_s=out.send_lag_max_s,
        sentences=sentences,
        segments=out.segments,
    )
    arrivals = pcm_arrivals(out.reads, out.bytes_per_sample)
    rec.samples = sum(n for _, n in arrivals)
    rec.chunks = len(arrivals)
    if out.ok and not arrivals:
        rec.ok, rec.code, rec.detail = False, "NO_AUDIO", "the response ended without a playable sample"
    if not rec.ok or not out.sample_rate:
        return rec
    rec.ttfa_s = arrivals[0][0] - out.start
    if rec.text_done_s is not None:
        rec.audio_before_text_done = rec.ttfa_s < rec.text_done_s
    rec.e2e_s = (out.end if out.end is not None else arrivals[-1][0]) - out.start
    rec.audio_s = rec.samples / out.sample_rate
    rec.rtf = rec.e2e_s / rec.audio_s
    if fixed_frames is not None:
        takes = 1 if sentences is None else (out.segments or 0)
        expected = round(takes * fixed_frames * out.sample_rate / frame_rate_hz)
        # A sentence without its own segment(s) is audio missing, whatever the sample count says.
        rec.length_ok = rec.samples == expected and (sentences is None or takes >= sentences)
    play: Playback = simulate_playback(
        [(t - out.start, n) for t, n in arrivals], out.sample_rate, tolerance_s=tolerance_s
    )
    rec.stalls, rec.stall_total_s, rec.stall_max_s, rec.max_lag_s = (
        play.stalls,
        play.stall_total_s,
        play.stall_max_s,
        play.max_lag_s,
    )
    rec.first_stall_audio_s = play.first_stall_at_s
    return rec


def _dist(values: list[float]) -> dict[str, float | None]:
    out: dict[str, float | None] = {f"p{q}": percentile(values, q) for q in PERCENTILES}
    out["mean"] = sum(values) / len(values) if values else None
    out["max"] = max(values) if values else None
    return out


def summarize(
    records: list[RequestRecord], *, peak_in_flight: int, offered_rate: float | None = None
) -> dict[str, Any]:
    """Aggregates over the measured (non-warm-up) requests of one level. Rates are over the measured
    window: from the first measured send to the last measured completion."""
    measured = [r for r in records if not r.warmup]
    wall_s = max((r.done_s for r in measured), default=0.0) - min((r.sent_s for r in measured), default=0.0)
    ok = [r for r in measured if r.ok]
    errors = collections.Counter(r.code for r in measured if not r.ok)
    underrun = [r for r in ok if r.stalls > 0]
    sends = sorted(r.sent_s for r in measured)
    send_window = sends[-1] - sends[0] if len(sends) > 1 else 0.0
    audio = sum(r.audio_s or 0.0 for r in ok)
    return {
        "requests": len(measured),
        "ok": len(ok),
        "errors": len(measured) - len(ok),
        "errors_by_code": dict(sorted(errors.items())),
        "warmup_requests": len(records) - len(measured),
        "wall_s": wall_s,
        "offered_rate": offered_rate,
        # Sends per second actually achieved (n - 1 gaps over the send window): below the offered rate
        # means the client could not keep the schedule.
        "sent_rate": (len(sends) - 1) / send_window if send_window > 0 else None,
        "completed_rate": len(ok) / wall_s if wall_s > 0 else None,
        "audio_s_per_s": audio / wall_s if wall_s > 0 else None,
        "peak_in_flight": peak_in_flight,
        "ttfa_s": _dist([r.ttfa_s for r in ok if r.ttfa_s is not None]),
        "e2e_s": _dist([r.e2e_s for r in ok if r.e2e_s is not None]),
        "rtf": _dist([r.rtf for r in ok if r.rtf is not None]),
        "server_ttfa_s": _dist([r.server_ttfa_s for r in ok if r.server_ttfa_s is not None]),
        "audio_s": _dist([r.audio_s for r in ok if r.audio_s is not None]),
        "underrun_requests": len(underrun),
        "underrun_rate": len(underrun) / len(ok) if ok else None,
        "stalls": sum(r.stalls for r in ok),
        "stall_total_s": sum(r.stall_total_s for r in ok),
        "stall_max_s": max((r.stall_max_s for r in ok), default=0.0),
        "max_lag_s": _dist([r.max_lag_s for r in ok]),
        # Where in the audio underruns start: early (the chunk ramp) or late (the steady state).
        "first_stall_audio_s": _dist(
            [r.first_stall_audio_s for r in underrun if r.first_stall_audio_s is not None]
        ),
        "length_mismatches": sum(1 for r in ok if r.length_ok is False),
        **_llm_summary(ok),
    }


def _llm_summary(ok: list[RequestRecord]) -> dict[str, Any]:
    """LLM-rate mode: when the text was complete, and how often first audio came before it (None: no
    request of the level streamed its text)."""
    llm = [r for r in ok if r.text_done_s is not None]
    if not llm:
        keys = ("text_done_s", "audio_before_text_done", "send_lag_max_s", "segments", "split_requests")
        return dict.fromkeys(keys)
    return {
        "text_done_s": _dist([r.text_done_s for r in llm if r.text_done_s is not None]),
        "audio_before_text_done": sum(1 for r in llm if r.audio_before_text_done),
        "send_lag_max_s": max(r.send_lag_max_s or 0.0 for r in llm),
        "segments": _dist([float(r.segments) for r in llm if r.segments is not None]),
        # Requests whose server made more segments than the client flushed sentences.
        "split_requests": sum(1 for r in llm if (r.segments or 0) > (r.sentences or 0)),
    }


@dataclass(frozen=True)
class Gate:
    """When a load level counts as sustained: no errors, no underruns and (optionally) p95 TTFA in bounds.

    Underruns alone cannot see queueing: a request that waits for a slot starts late but then plays without
    a gap, so the TTFA bound is what stops a level that only queues from passing as capacity.
    """

    ttfa_p95_max_s: float | None = 1.0

    def verdict(self, agg: dict[str, Any]) -> tuple[bool, str]:
        if agg["ok"] == 0:
            return False, "no successful request"
        if agg["errors"]:
            return False, f"{agg['errors']} errors {agg['errors_by_code']}"
        if agg["underrun_requests"]:
            return False, f"{agg['underrun_requests']} of {agg['ok']} requests underran"
        if agg["length_mismatches"]:
            return False, f"{agg['length_mismatches']} requests had the wrong audio length"
        p95 = agg["ttfa_s"]["p95"]
        if self.ttfa_p95_max_s is not None and p95 is not None and p95 > self.ttfa_p95_max_s:
            return False, f"p95 TTFA {p95 * 1e3:.0f} ms > {self.ttfa_p95_max_s * 1e3:.0f} ms"
        return True, "sustained"


def record_dict(rec: RequestRecord) -> dict[str, Any]:
    # Microseconds are plenty for latencies measured in milliseconds; full float repr doubles the file size
    # (a search level at tens of req/s holds thousands of records).
    return {k: round(v, 6) if isinstance(v, float) else v for k, v in asdict(rec).items()}
