"""bench/stamps.py joins the stamps of every process by request id and orders each request's hops."""

from __future__ import annotations

import pytest

from bench import stamps

LOG = """\
$ python -m voxstage serve ...
STAMP 10.000 1 gateway.open a
STAMP 10.002 2 codec.open a
noise line
STAMP 10.005 3 talker.open a
STAMP 10.006 3 talker.open a
STAMP 10.010 1 gateway.pcm a
STAMP 20.000 1 gateway.open b
STAMP 20.001 2 codec.open b
STAMP 20.003 3 talker.open b
STAMP 20.008 1 gateway.pcm b
STAMP 30.000 1 gateway.open c
STAMP 30.001 2 codec.open c
STAMP 30.500 3 talker.open -
STAMP 5.000 2 codec.open z
"""


def test_requests_keep_each_points_first_stamp_and_only_their_windows() -> None:
    reqs = stamps.requests(LOG)
    assert set(reqs) == {"a", "b", "c"}  # z's open is not in the log, "-" names no request
    assert reqs["a"]["talker.open"] == pytest.approx(10.005)
    assert set(stamps.requests(LOG, [(19.0, 21.0)])) == {"b"}


def test_a_stamp_under_an_alias_is_its_requests() -> None:
    log = LOG + "ALIAS ts7.0 b\nSTAMP 20.004 3 talker.engine ts7.0\nSTAMP 20.005 3 talker.engine ts9.0\n"
    reqs = stamps.requests(log)
    assert reqs["b"]["talker.engine"] == pytest.approx(20.004)  # the engine's name for b
    assert "ts9.0" not in reqs and "talker.engine" not in reqs["a"]


def test_a_point_most_requests_pass_by_is_left_out() -> None:
    log = LOG + "STAMP 10.004 3 talker.prefill a\n"  # one of three requests prefilled
    got = stamps.summary(stamps.requests(log))
    assert got["requests"] == 2 and "talker.prefill" not in got["after_open_ms"]


def test_the_summary_orders_hops_and_leaves_out_requests_cut_short() -> None:
    got = stamps.summary(stamps.requests(LOG))
    assert got["requests"] == 2  # c never reached talker.open or gateway.pcm
    assert list(got["after_open_ms"]) == ["gateway.open", "codec.open", "talker.open", "gateway.pcm"]
    hop = got["hops_ms"]["codec.open -> talker.open"]
    assert hop == {"p50": pytest.approx(2.5), "mean": pytest.approx(2.5)}
    assert got["after_open_ms"]["gateway.pcm"] == pytest.approx(9.0)
    assert stamps.summary({}) == {"requests": 0}
    only_b = stamps.summary(stamps.requests(LOG, [(19.0, 21.0)]))
    assert stamps.diff(got, only_b)["gateway.open -> codec.open"] == pytest.approx(0.5)


def test_the_hook_goes_first_on_the_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/tmp/vx-pkg:/tmp/vx-site")
    assert stamps.env()["PYTHONPATH"].split(":") == [str(stamps.HOOK), "/tmp/vx-pkg", "/tmp/vx-site"]
    assert (stamps.HOOK / "sitecustomize.py").is_file()
