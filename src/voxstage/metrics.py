"""Prometheus metrics. The names in ARCHITECTURE.md §7 are a contract: dashboards and alerts depend on them.

Base units, no per-request labels. Each process owns one registry (``REGISTRY``) and serves it on its own
``/metrics``; time-to-first-audio is observed only at the gateway, from request arrival to the first PCM byte
sent, because per-stage first-output times under-report what a user hears.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

REGISTRY = CollectorRegistry(auto_describe=True)

# Dense between 5 ms and 100 ms, where a streaming TTS server must live, then a tail to 2 s.
TTFA_BUCKETS = (
    0.005, 0.0075, 0.01, 0.0125, 0.015, 0.0175, 0.02, 0.025, 0.03, 0.035, 0.04, 0.05, 0.06, 0.07, 0.08,
    0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0,
)  # fmt: skip
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0, 120.0, 300.0)
RTF_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0)
UNDERRUN_BUCKETS = (0.001, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)
# A talker/codec tick must stay far below the 80 ms frame period; resolve 0.25 ms .. 80 ms and beyond.
TICK_BUCKETS = (
    0.00025, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08,
    0.12, 0.25, 0.5,
)  # fmt: skip
HOP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)

TIME_TO_FIRST_AUDIO = Histogram(
    "voxstage_time_to_first_audio_seconds",
    "Gateway: request arrival to the first PCM byte sent to the client.",
    ["api"],
    buckets=TTFA_BUCKETS,
    registry=REGISTRY,
)
REQUEST_DURATION = Histogram(
    "voxstage_request_duration_seconds",
    "Gateway: request arrival to the last byte sent.",
    ["api"],
    buckets=DURATION_BUCKETS,
    registry=REGISTRY,
)
REAL_TIME_FACTOR = Histogram(
    "voxstage_real_time_factor",
    "Gateway: per-request generation wall time divided by the audio duration produced (lower is faster).",
    buckets=RTF_BUCKETS,
    registry=REGISTRY,
)
AUDIO_UNDERRUN = Histogram(
    "voxstage_audio_underrun_seconds",
    "Gateway: per-request total playback deficit of a no-prebuffer player started at the first chunk.",
    buckets=UNDERRUN_BUCKETS,
    registry=REGISTRY,
)
STAGE_TICK = Histogram(
    "voxstage_stage_tick_seconds",
    "Wall time of one engine tick (one frame step for all active talker slots; one codec decode batch).",
    ["stage"],
    buckets=TICK_BUCKETS,
    registry=REGISTRY,
)
ACTIVE_STREAMS = Gauge(
    "voxstage_active_streams", "Streams currently held by the stage.", ["stage"], registry=REGISTRY
)
QUEUE_DEPTH = Gauge(
    "voxstage_queue_depth", "Requests admitted but waiting for a slot.", ["stage"], registry=REGISTRY
)
REQUESTS = Counter(
    "voxstage_requests", "Requests finished, by outcome.", ["outcome"], registry=REGISTRY
)  # exported as voxstage_requests_total
STAGE_REQUESTS = Counter(
    "voxstage_stage_requests",
    "Requests a stage engine finished, by finish reason (eos, max_frames, cancelled, ...).",
    ["stage", "finish"],
    registry=REGISTRY,
)  # exported as voxstage_stage_requests_total; voxstage_requests_total is the gateway's user-facing count
STAGE_HOP = Histogram(
    "voxstage_stage_hop_seconds",
    "Time from a stage sending a message to the next stage receiving it (same-host clocks).",
    ["from", "to"],
    buckets=HOP_BUCKETS,
    registry=REGISTRY,
)
SLOTS_IN_USE = Gauge("voxstage_slots_in_use", "Engine slots in use.", ["stage"], registry=REGISTRY)
SLOTS_TOTAL = Gauge("voxstage_slots", "Engine slots configured.", ["stage"], registry=REGISTRY)
AUDIO_GENERATED = Counter(
    "voxstage_audio_generated_seconds", "Seconds of audio produced.", ["stage"], registry=REGISTRY
)
TRANSPORT_BYTES = Counter(
    "voxstage_transport_bytes",
    "Inter-stage payload bytes, by path (inline or shm).",
    ["path"],
    registry=REGISTRY,
)
LINK_BATCHES = Counter(
    "voxstage_link_batches",
    "Stage-link batches sent (one per tick per direction carries every request's messages), by this end.",
    ["end"],
    registry=REGISTRY,
)
LINK_ITEMS = Counter(
    "voxstage_link_items",
    "Per-request messages and signals carried in stage-link batches sent, by this end.",
    ["end"],
    registry=REGISTRY,
)
SHM_SLOTS_LENT = Gauge(
    "voxstage_shm_slots_lent",
    "Shared-memory slots this stage lent to its downstream (per stream or per link batch) and not yet acked.",
    registry=REGISTRY,
)
SHM_FALLBACKS = Counter(
    "voxstage_shm_fallbacks",
    "Payloads that wanted shm but went inline (peer cannot see the region).",
    registry=REGISTRY,
)
PREFILL_TOKENS = Counter(
    "voxstage_prefill_tokens", "Prompt positions, by how they were obtained.", ["source"], registry=REGISTRY
)  # source="computed" | "prefix_cache"
VOICE_CACHE = Counter(
    "voxstage_voice_cache_lookups",
    "Talker lookups of a voice-library voice's ready prompt, by result.",
    ["result"],
    registry=REGISTRY,
)  # result="hit" | "miss"
CODEC_VOICE_STATES = Counter(
    "voxstage_codec_voice_state_lookups",
    "Codec lookups of a voice-library voice's decoder state after its reference prefix, by result.",
    ["result"],
    registry=REGISTRY,
)  # result="hit" | "miss"
CODEC_CHUNK_WAIT = Histogram(
    "voxstage_codec_chunk_wait_seconds",
    "Codec (text to speech): from a chunk's frames all being in to its audio handed out (queue and decode).",
    ["chunk"],
    buckets=TICK_BUCKETS,
    registry=REGISTRY,
)  # chunk="first" | "short" (the ramp's, a stream's remainder) | "steady"
CODEC_CHUNK_DECODE = Histogram(
    "voxstage_codec_chunk_decode_seconds",
    "Codec (text to speech): from a chunk's decode being launched to its audio handed out (the part of "
    "voxstage_codec_chunk_wait_seconds after the chunk left the codec's queue).",
    ["chunk"],
    buckets=TICK_BUCKETS,
    registry=REGISTRY,
)  # chunk as for voxstage_codec_chunk_wait_seconds
CODEC_LATE_CHUNKS = Histogram(
    "voxstage_codec_late_chunk_seconds",
    "Codec (text to speech): how long after a no-prebuffer player (started at the stream's first audio) ran "
    "dry a chunk's audio was handed out, by cause: its frames came after that moment, or the codec held "
    "them.",
    ["cause"],
    buckets=UNDERRUN_BUCKETS,
    registry=REGISTRY,
)  # cause="frames" | "codec"
CODEC_DECODE_FRAMES = Counter(
    "voxstage_codec_decode_frames",
    "Codec (text to speech): frame rows its decode calls computed, by part: audio (frames whose audio is "
    "handed out), prefix (a voice clone's reference codes, decoded for the state they leave), context "
    "(overlap+crop's frames decoded again) and padding (a call's batch and frame buckets past its rows).",
    ["part"],
    registry=REGISTRY,
)  # part="audio" | "prefix" | "context" | "padding"; exported as voxstage_codec_decode_frames_total
CODEC_DECODE_CALLS = Counter(
    "voxstage_codec_decode_calls",
    "Codec (text to speech): decode calls launched (one graph replay or eager forward each).",
    registry=REGISTRY,
)  # exported as voxstage_codec_decode_calls_total
CODEC_LANE_CALLS = Counter(
    "voxstage_codec_lane_calls",
    "Codec (text to speech) with two lanes (codec_urgent_lane_ms): decode calls launched, by lane.",
    ["lane"],
    registry=REGISTRY,
)  # lane="urgent" | "bulk"; exported as voxstage_codec_lane_calls_total
CODEC_LANE_ROWS = Counter(
    "voxstage_codec_lane_rows",
    "Codec (text to speech) with two lanes: frame rows its decode calls computed (batch bucket x frame "
    "bucket), by lane.",
    ["lane"],
    registry=REGISTRY,
)  # exported as voxstage_codec_lane_rows_total
DECODE_PARTS = ("audio", "prefix", "context", "padding")
# Children looked up once: a tick launches one call or more.
CODEC_DECODE_PART = {part: CODEC_DECODE_FRAMES.labels(part) for part in DECODE_PARTS}
TALKER_PACED = Counter(
    "voxstage_talker_paced_steps",
    "Text-to-speech frame steps the talker put off under load: whole steps, for the step interval "
    "(pace_realtime_x), and streams' steps, for being far ahead of real time (pace_ahead_s).",
    ["by"],
    registry=REGISTRY,
)  # by="interval" | "ahead"
INPUT_STARVED = Counter(
    "voxstage_input_starved_frames",
    "Frame steps a talker slot skipped because streamed text had not arrived yet.",
    registry=REGISTRY,
)
DUPLEX_DROPPED_USER_FRAMES = Counter(
    "voxstage_duplex_dropped_user_frames",
    "User frames a duplex talker session dropped because its input queue lagged behind real time.",
    registry=REGISTRY,
)
DUPLEX_JITTER_DROPPED = Counter(
    "voxstage_duplex_jitter_dropped_seconds",
    "Codec: seconds of user audio dropped (oldest first) because a session's jitter buffer was full.",
    registry=REGISTRY,
)  # exported as voxstage_duplex_jitter_dropped_seconds_total


_HOPS: dict[tuple[str, str], Any] = {}  # the hop histogram's children: a frame of every stream each tick


def observe_hop(source: str, dest: str, sent_unix_ns: int) -> None:
    """Record one inter-stage hop from the sender's stamp (skipped when unset or the clocks disagree)."""
    if sent_unix_ns > 0:
        delay = (time.time_ns() - sent_unix_ns) / 1e9
        if delay >= 0:
            child = _HOPS.get((source, dest))
            if child is None:
                child = _HOPS[(source, dest)] = STAGE_HOP.labels(source, dest)
            child.observe(delay)


# -- full-duplex sessions ------------------------------------------------------------------------------
# An answer inside one 80 ms frame is the goal; resolve 20 ms .. 1 s and a tail for stalled sessions.
DUPLEX_LATENCY_BUCKETS = (
    0.02, 0.04, 0.06, 0.08, 0.1, 0.12, 0.14, 0.16, 0.18, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 5.0,
)  # fmt: skip
DUPLEX_SESSIONS = Gauge(
    "voxstage_duplex_sessions",
    "Gateway: live full-duplex sessions (admitted and not yet closed).",
    registry=REGISTRY,
)
DUPLEX_REFUSED = Counter(
    "voxstage_duplex_refused_sessions",
    "Gateway: duplex sessions refused, by reason (max_sessions, stage_capacity, unavailable, draining, "
    "session_mode).",
    ["reason"],
    registry=REGISTRY,
)  # exported as voxstage_duplex_refused_sessions_total
DUPLEX_ENDED = Counter(
    "voxstage_duplex_ended_sessions",
    "Gateway: duplex sessions the gateway ended because of their client, by reason (send_timeout: the "
    "client stopped reading for gateway.duplex_send_timeout_s).",
    ["reason"],
    registry=REGISTRY,
)  # exported as voxstage_duplex_ended_sessions_total
DUPLEX_DROPPED_INPUT = Counter(
    "voxstage_duplex_dropped_input_seconds",
    "Gateway: seconds of user audio dropped because more than 2 s of it waited beyond the codec's grant.",
    registry=REGISTRY,
)  # exported as voxstage_duplex_dropped_input_seconds_total
DUPLEX_RESPONSE_LATENCY = Histogram(
    "voxstage_duplex_response_latency_seconds",
    "Gateway: from the last byte of a user frame arriving to the agent audio that answers it leaving.",
    buckets=DUPLEX_LATENCY_BUCKETS,
    registry=REGISTRY,
)
DUPLEX_JOIN = Histogram(
    "voxstage_duplex_join_seconds",
    "Gateway: a duplex session's join, by phase (open: from its first user audio to the stages' opened, the "
    "codec's and the talker's admission; first_audio: from opened to its first agent audio sent).",
    ["phase"],
    buckets=DUPLEX_LATENCY_BUCKETS,
    registry=REGISTRY,
)
DUPLEX_PREFILL_WAIT = Histogram(
    "voxstage_duplex_prefill_wait_seconds",
    "Talker: a duplex session's admission to its first step (its prompt's prefill and the wait for it).",
    buckets=DUPLEX_LATENCY_BUCKETS,
    registry=REGISTRY,
)
DUPLEX_LATE_FRAMES = Counter(
    "voxstage_duplex_late_frames",
    "Codec: agent frames whose PCM left after their tick's start plus one tick (80 ms).",
    registry=REGISTRY,
)  # exported as voxstage_duplex_late_frames_total
DUPLEX_INPUT_UNDERFLOW = Counter(
    "voxstage_duplex_input_underflow_ticks",
    "Codec: session ticks that ran on silence because no user frame had arrived.",
    registry=REGISTRY,
)  # exported as voxstage_duplex_input_underflow_ticks_total
DUPLEX_SKIPPED_TICKS = Counter(
    "voxstage_duplex_skipped_ticks",
    "Codec: grid ticks the engine started too late for; each live session's audio of them is dropped.",
    registry=REGISTRY,
)  # exported as voxstage_duplex_skipped_ticks_total
GC_PAUSE = Histogram(
    "voxstage_gc_pause_seconds",
    "Every process: one pass of Python's cyclic garbage collector, by generation (it holds the GIL: the "
    "engine thread and the event loop wait); the start-up heap is frozen out of it (voxstage.heap).",
    ["generation"],
    buckets=HOP_BUCKETS,
    registry=REGISTRY,
)
EVENT_LOOP_LAG = Histogram(
    "voxstage_event_loop_lag_seconds",
    "Every process: how much later than asked its event loop's probe woke from a 20 ms sleep; a block of "
    "the loop (a long callback, a GC pass, another thread holding the GIL) delays every session's next "
    "message by as much (voxstage.loop_lag).",
    buckets=(0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 1.0),
    registry=REGISTRY,
)
