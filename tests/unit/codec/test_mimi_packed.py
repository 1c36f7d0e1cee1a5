"""The packed streaming path (rows are slots [0, B), stepped in place) equals the slot-indexed one exactly.

A duplex engine keeps its sessions packed: a joining session takes slot B, a leaving one is replaced by the
last (``move_slot``). The tests drive such an engine on the packed API next to a slot-indexed codec whose
sessions sit on scrambled, never-moving slots, with the same rows in the same order, so both run the same
math on the same inputs: outputs and pool states must be identical, not merely close. A solo offline pass
per session checks that both are also right. Tiny preset with a 12-step attention context, so the 10-entry
K/V history wraps every 5 frames.
"""

from __future__ import annotations

import random

import pytest
import torch

from services.codec.models.mimi.config import QuantizerConfig
from services.codec.models.mimi.loader import random_init
from services.codec.models.mimi.model import MimiModel
from services.codec.models.mimi.presets import tiny_config
from services.codec.models.mimi.quantizer import Codebook, SplitResidualVQ
from services.codec.models.mimi.streaming import MimiStreamingCodec
from tests.unit.codec.codec_kit import noise_pcm, random_codes

TOL = 1e-5
SPF = 1920
K = 8


@pytest.fixture(scope="module")
def model() -> MimiModel:
    return random_init(tiny_config().with_overrides({"transformer": {"context": 12}}), seed=3)


def _codes(seed: int, frames: int, batch: int = 1) -> torch.Tensor:
    return random_codes(seed, frames, batch, groups=K)


_pcm = noise_pcm


def _assert_same_rows(packed: MimiStreamingCodec, ref: MimiStreamingCodec, ref_slots: list[int]) -> None:
    """Pool rows [0, B) of ``packed`` equal rows ``ref_slots`` of ``ref``, both directions, bit for bit."""
    b = len(ref_slots)
    for direction in ("encode", "decode"):
        mine = packed.encode_state() if direction == "encode" else packed.decode_state()
        theirs = ref.encode_state() if direction == "encode" else ref.decode_state()
        for key in mine:
            assert torch.equal(mine[key][:b], theirs[key][ref_slots]), f"{direction} {key}"
        positions = [packed.position(s, direction) for s in range(b)]
        assert positions == [ref.position(s, direction) for s in ref_slots]


def test_packed_engine_equals_slot_indexed(model: MimiModel) -> None:
    """Sessions join at staggered ticks and leave when done (the last one moves into the hole); each tick
    takes random chunk sizes padded to one (B, T) bucket, sometimes with a scratch row of length 0, and
    uses ``lengths=None`` whenever every row is full."""
    total = {0: 23, 1: 14, 2: 19, 3: 9, 4: 16}
    first_tick = {0: 0, 1: 1, 2: 1, 3: 4, 4: 7}
    ref_slot = {0: 4, 1: 0, 2: 6, 3: 2, 4: 5}  # the slot-indexed codec's scrambled, fixed slots
    scratch_ref_slot = 3
    codes = {s: _codes(20 + s, n) for s, n in total.items()}
    pcm = {s: _pcm(30 + s, n) for s, n in total.items()}
    packed = MimiStreamingCodec(model, max_streams=6)
    ref = MimiStreamingCodec(model, max_streams=7)
    rng = random.Random(5)
    live: list[int] = []  # session on packed slot i = live[i]
    done = dict.fromkeys(total, 0)
    out_pcm: dict[int, list[torch.Tensor]] = {s: [] for s in total}
    out_lat: dict[int, list[torch.Tensor]] = {s: [] for s in total}
    static_calls = moves = 0
    for tick in range(40):
        for s in total:
            if first_tick[s] == tick:
                packed.reset(torch.tensor([len(live)]))
                live.append(s)
        if not live:
            continue
        take = {s: min(rng.choice([0, 1, 1, 2, 3]), total[s] - done[s]) for s in live}
        t = max(1, *take.values())
        pad = rng.random() < 0.3 and len(live) < packed.max_streams
        rows = live + ([-1] if pad else [])  # -1: the bucket's scratch row
        lengths_list = [take[s] if s >= 0 else 0 for s in rows]
        lengths = None if all(n == t for n in lengths_list) else torch.tensor(lengths_list)
        static_calls += lengths is None
        batch_codes = torch.full((len(rows), K, t), 7, dtype=torch.int64)
        batch_pcm = torch.randn(len(rows), t * SPF)  # padding: loud noise, must not leak
        for row, s in enumerate(rows):
            if s >= 0:
                n, d = take[s], done[s]
                batch_codes[row, :, :n] = codes[s][0, :, d : d + n]
                batch_pcm[row, : n * SPF] = pcm[s][0, d * SPF : (d + n) * SPF]
        slots = torch.tensor([ref_slot[s] if s >= 0 else scratch_ref_slot for s in rows])
        wav = packed.decode_packed(batch_codes, lengths)
        ref_wav = ref.decode(batch_codes, slots, lengths)
        got_codes, lat = packed.encode_packed_with_latent(batch_pcm, lengths)
        ref_codes, ref_lat = ref.encode_with_latent(batch_pcm, slots, lengths)
        # Live rows, padded frames included (same state, same inputs); a scratch row's output is garbage
        # from whatever its scratch slot holds, which differs between the two codecs.
        b = len(live)
        assert torch.equal(wav[:b], ref_wav[:b])
        assert torch.equal(got_codes[:b], ref_codes[:b]) and torch.equal(lat[:b], ref_lat[:b])
        for row, s in enumerate(live):
            out_pcm[s].append(wav[row, : take[s] * SPF])
            out_lat[s].append(lat[row, :, : take[s]])
            done[s] += take[s]
        _assert_same_rows(packed, ref, [ref_slot[s] for s in live])
        for s in [s for s in live if done[s] == total[s]]:
            hole, last = live.index(s), len(live) - 1
            if hole != last:
                packed.move_slot(last, hole)
                live[hole] = live[last]
                moves += 1
            live.pop()
        _assert_same_rows(packed, ref, [ref_slot[s] for s in live])
    assert all(done[s] == total[s] for s in total) and not live
    assert static_calls > 3 and moves >= 2  # the schedule reaches both lengths forms and real moves
    with torch.inference_mode():
        for s in total:
            pcm_err = (torch.cat(out_pcm[s]) - model.decode(codes[s])[0]).abs().max().item()
            lat_err = (torch.cat(out_lat[s], dim=-1) - model.encode_latent(pcm[s])[0]).abs().max().item()
            assert pcm_err <= TOL and lat_err <= TOL, f"session {s}: pcm {pcm_err:.2e}, latent {lat_err:.2e}"


def test_move_slot_copies_both_directions(model: MimiModel) -> None:
    codec = MimiStreamingCodec(model, max_streams=3)
    codec.decode(_codes(1, 5), torch.tensor([2]))
    codec.encode(_pcm(2, 3), torch.tensor([2]))
    before = {k: v.clone() for k, v in codec.decode_state().items()}
    codec.move_slot(2, 0)
    enc, dec = codec.encode_state(), codec.decode_state()
    assert all(torch.equal(t[0], t[2]) for t in [*enc.values(), *dec.values()])
    assert codec.position(0, "decode") == 5 and codec.position(0, "encode") == 3
    assert codec.position(2, "decode") == 5  # the source is left as it was
    assert all(torch.equal(dec[k][2], before[k][2]) for k in dec)
    for src, dst in ((3, 0), (0, -1)):
        with pytest.raises(ValueError, match=r"must lie in \[0, 3\)"):
            codec.move_slot(src, dst)


def test_zero_length_scratch_row_keeps_its_slot(model: MimiModel) -> None:
    codec = MimiStreamingCodec(model, max_streams=2)
    codec.decode_packed(_codes(3, 2, batch=2))
    codec.encode_packed(_pcm(4, 2, batch=2))
    enc, dec = ({k: v[1].clone() for k, v in d.items()} for d in (codec.encode_state(), codec.decode_state()))
    lengths = torch.tensor([2, 0])
    codec.decode_packed(_codes(5, 2, batch=2), lengths)
    codec.encode_packed(torch.randn(2, 2 * SPF), lengths)
    assert codec.position(0, "decode") == codec.position(0, "encode") == 4
    assert codec.position(1, "decode") == codec.position(1, "encode") == 2
    assert all(torch.equal(v[1], enc[k]) for k, v in codec.encode_state().items())
    assert all(torch.equal(v[1], dec[k]) for k, v in codec.decode_state().items())


def test_full_lengths_match_the_static_path(model: MimiModel) -> None:
    """``lengths=None`` slices each new history statically; explicit full lengths gather it per row."""
    codecs = [MimiStreamingCodec(model, max_streams=2) for _ in range(2)]
    full = torch.tensor([3, 3])
    for step in range(3):
        codes, pcm = _codes(10 + step, 3, batch=2), _pcm(20 + step, 3, batch=2)
        a = codecs[0].decode_packed(codes), codecs[0].encode_packed_with_latent(pcm)
        b = codecs[1].decode_packed(codes, full), codecs[1].encode_packed_with_latent(pcm, full)
        assert torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1], strict=True))
    for get in (MimiStreamingCodec.encode_state, MimiStreamingCodec.decode_state):
        assert all(torch.equal(v, get(codecs[1])[k]) for k, v in get(codecs[0]).items())


def test_packed_rejects_bad_requests(model: MimiModel) -> None:
    codec = MimiStreamingCodec(model, max_streams=2)
    with pytest.raises(ValueError, match="at most max_streams=2 rows"):
        codec.decode_packed(_codes(1, 1, batch=3))
    with pytest.raises(ValueError, match=r"lengths must lie in \[0, 2\]"):
        codec.encode_packed(_pcm(2, 2, batch=2), torch.tensor([3, 0]))
    with pytest.raises(ValueError, match="lengths must be an int64 tensor"):
        codec.decode_packed(_codes(3, 2, batch=2), torch.tensor([1, 1], dtype=torch.int32))
    assert all(codec.position(s, d) == 0 for s in (0, 1) for d in ("encode", "decode"))  # type: ignore[arg-type]


def _cdist_encode(q: SplitResidualVQ, latent: torch.Tensor) -> torch.Tensor:
    """The reference's split-RVQ encode, written with ``torch.cdist`` per codebook."""
    b, _, t = latent.shape

    def nearest(x: torch.Tensor, k: int) -> torch.Tensor:
        flat = x.transpose(1, 2).reshape(b * t, -1)
        return torch.cdist(flat[None], q.codebooks[k][None], p=2.0)[0].argmin(dim=-1).view(b, t)

    codes = [nearest(q.rvq_first.input_proj(latent), 0)]
    residual = q.rvq_rest.input_proj(latent)
    for k in range(1, q.num_codebooks):
        codes.append(nearest(residual, k))
        residual = residual - torch.nn.functional.embedding(codes[-1], q.codebooks[k]).transpose(1, 2)
    return torch.stack(codes, dim=1)


@pytest.mark.parametrize(("dim", "bins", "frames"), [(16, 2048, 3), (256, 2048, 40), (8, 20, 5), (8, 20, 30)])
def test_codebook_search_is_cdist_bit_for_bit(dim: int, bins: int, frames: int) -> None:
    """The precomputed search tables pick exactly torch.cdist's codes, duplicate codebook vectors (exact
    ties) included, on both sides of cdist's switch to its matrix-product form."""
    gen = torch.Generator().manual_seed(dim + bins + frames)
    cfg = QuantizerConfig(dimension=dim, n_q=8, bins=bins, input_dimension=32, output_dimension=32)
    q = SplitResidualVQ(cfg, num_codebooks=8)
    with torch.no_grad():
        for p in q.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) / p.shape[1] ** 0.5)
        for book in (m for m in q.modules() if isinstance(m, Codebook)):
            book.embedding_sum.copy_(torch.randn(book.embedding_sum.shape, generator=gen))
            book.embedding_sum[5] = book.embedding_sum[2]  # an exact tie
        q.refresh_codebooks()
    latent = torch.randn(2, 32, frames, generator=gen) * 2
    with torch.inference_mode():
        assert torch.equal(q.encode(latent), _cdist_encode(q, latent))
