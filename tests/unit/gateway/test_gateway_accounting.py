"""Per-request accounting: the simulated no-prebuffer player, and what reaches the contract metrics."""

from __future__ import annotations

from gateway_fakes import FakeCodec
from gateway_kit import MakeStack

from gateway.accounting import PlaybackSimulator, RequestAccounting
from voxstage import metrics
from voxstage.v1 import speech_pb2


def sample(name: str, labels: dict[str, str] | None = None) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels or {}) or 0.0


def test_player_stalls_only_when_audio_runs_out() -> None:
    player = PlaybackSimulator()
    player.on_chunk(0.0, 1.0)  # starts playing at the first chunk: busy until t=1
    player.on_chunk(0.5, 1.0)  # arrives early: queued, busy until t=2
    assert player.underrun_s == 0.0
    player.on_chunk(3.0, 0.5)  # one second late: the player waited 1 s
    assert player.underrun_s == 1.0 and player.play_until == 3.5
    player.on_chunk(10.0, 1.0, restart=True)  # a new segment starts its own playback
    assert player.underrun_s == 1.0


def test_accounting_observes_each_metric_once() -> None:
    before = {
        "ttfa": sample("voxstage_time_to_first_audio_seconds_count", {"api": "test"}),
        "ttfa_sum": sample("voxstage_time_to_first_audio_seconds_sum", {"api": "test"}),
        "rtf": sample("voxstage_real_time_factor_count"),
        "under": sample("voxstage_audio_underrun_seconds_sum"),
        "ok": sample("voxstage_requests_total", {"outcome": "ok"}),
    }
    acct = RequestAccounting("test", arrival=100.0)
    acct.on_audio_sent(0.5, now=100.2)  # first audio 200 ms after arrival
    acct.on_audio_sent(0.5, now=101.0)  # the player ran dry at 100.7: 0.3 s underrun
    acct.finish("ok", now=101.1)
    acct.finish("ok", now=102.0)  # idempotent
    assert sample("voxstage_time_to_first_audio_seconds_count", {"api": "test"}) == before["ttfa"] + 1
    ttfa_sum = sample("voxstage_time_to_first_audio_seconds_sum", {"api": "test"}) - before["ttfa_sum"]
    assert abs(ttfa_sum - 0.2) < 1e-9
    assert sample("voxstage_real_time_factor_count") == before["rtf"] + 1
    assert abs(sample("voxstage_audio_underrun_seconds_sum") - before["under"] - 0.3) < 1e-9
    assert sample("voxstage_requests_total", {"outcome": "ok"}) == before["ok"] + 1


def test_whole_clip_ttfa_is_when_the_clip_leaves() -> None:
    acct = RequestAccounting("test_clip", whole_clip=True, arrival=0.0)
    acct.on_audio_sent(1.0, now=0.1)
    assert acct.ttfa_s is None  # nothing has reached the client yet
    acct.clip_sent(now=0.9)
    assert acct.ttfa_s == 0.9


async def test_a_slower_than_real_time_stage_shows_underruns(make_stack: MakeStack) -> None:
    # 100 ms per 80 ms frame, in 2-frame chunks: each chunk arrives after the previous one finished playing.
    stack = await make_stack(FakeCodec(frame_delay_s=0.1))
    before = sample("voxstage_audio_underrun_seconds_sum")
    rtf_before = sample("voxstage_real_time_factor_sum")

    async def requests():  # type: ignore[no-untyped-def]
        config = speech_pb2.SynthesisConfig(encoding=speech_pb2.AUDIO_ENCODING_PCM_S16LE)
        config.chunk_schedule.initial_chunk_frames = 2
        config.chunk_schedule.steady_chunk_frames = 2
        yield speech_pb2.StreamingSynthesizeRequest(config=config)
        yield speech_pb2.StreamingSynthesizeRequest(text="abcdefgh")

    async for _ in stack.stub.StreamingSynthesize(requests()):
        pass
    underrun = sample("voxstage_audio_underrun_seconds_sum") - before
    assert 0.08 < underrun < 0.5  # 3 late chunks x ~40 ms each, plus scheduling noise
    assert sample("voxstage_real_time_factor_sum") - rtf_before > 1.0
