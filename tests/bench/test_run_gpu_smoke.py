"""CPU smoke tests of ``bench/run_gpu.py``'s new serving runs on the tiny preset: the LLM-rate phase (text as
deltas, a flush per sentence), the official ``openai`` client on kept-alive connections (on the same stack)
and the closed search against two talker + codec pairs. CPU timing is not a benchmark: only the files, their
shapes and the counts are checked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import run_gpu
from bench.llm_stream import load_answers, segment_budget

pytestmark = pytest.mark.timeout(150)

FRAMES = 20
SPF = 1920  # samples per 80 ms frame at 24 kHz
BASE = ["--models", "qwen3-tts-tiny", "--profile", "smoke", "--device", "cpu", "--threads", "1"]
BASE += ["--slots", "2", "--frames", str(FRAMES)]


@pytest.fixture
def cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VOXSTAGE_CACHE", str(tmp_path_factory.getbasetemp() / "vxcache"))


def load(path: Path) -> dict:
    return json.loads(path.read_text())


def test_llm_and_openai_phases_measure_and_report(tmp_path: Path, cache: None) -> None:
    # 300 tokens/s keeps a CPU request near a second; the schedule logic is the same as at 30.
    phases = ["--phases", "openai,llm,report", "--llm-tokens-per-s", "300"]
    assert run_gpu.main(["--out", str(tmp_path), *BASE, *phases]) == 0
    check_openai_phase(tmp_path)
    sentences = 10  # every answer in prompts/llm_answers.txt
    budget = segment_budget(FRAMES, sentences)
    assert budget == 2
    names = ("ttfa_1rps_llm_tiny", "c1_llm_tiny", "closed_search_llm_tiny")
    docs = {name: load(tmp_path / f"{name}.json") for name in names}
    assert docs["closed_search_llm_tiny"]["search"]["kind"] == "closed"
    assert [lv["level"] for lv in docs["c1_llm_tiny"]["levels"]] == [1]
    answers = load_answers()
    for name, doc in docs.items():
        assert doc["config"]["text_mode"] == "llm" and doc["config"]["segment_frames"] == 0, name
        for level in doc["levels"]:
            agg = level["aggregate"]
            assert agg["errors"] == 0 and agg["ok"] >= 1, (name, agg["errors_by_code"])
            assert agg["length_mismatches"] == 0 and agg["audio_before_text_done"] is not None
            for r in level["records"]:
                assert r["api"] == "grpc-llm" and r["ok"] and r["sentences"] == sentences, r
                assert r["text_chars"] == len(answers[r["prompt_id"]])
                # Each segment runs to its per-segment budget; the server may cut a sentence in more.
                assert r["segments"] >= sentences and r["frames"] == budget * r["segments"], r
                assert r["samples"] == r["frames"] * SPF and r["length_ok"] is True
                assert 0 < r["ttfa_s"] <= r["e2e_s"] < 60 and 0 < r["text_done_s"] < r["e2e_s"]
                # 200-odd deltas at 300/s: the last one leaves about 0.65 s after the first.
                assert 0.5 < r["text_done_s"] < 5 and r["send_lag_max_s"] >= 0
                assert r["audio_before_text_done"] == (r["ttfa_s"] < r["text_done_s"])
    meta = load(tmp_path / "serve_tiny.json")
    assert meta["exit_code"] == 0 and meta["llm"]["tokens_per_s"] == 300.0
    assert [run["phase"] for run in meta["runs"]][-3:] == list(names)
    summary = load(tmp_path / "summary.json")["models"]["qwen3-tts-tiny"]
    assert summary["c1_llm"]["n"] == 1 and summary["ttfa_1rps_llm"]["p50_ms"] > 0
    assert summary["closed_search_llm"]["levels"]
    assert "LLM deltas" in (tmp_path / "summary.md").read_text()


def check_openai_phase(out: Path) -> None:
    """Issue 29: the official client at c=1 and in a closed search, every response read to its end, on
    connections it kept alive: one connection (opened before the clock) carried every c=1 request."""
    c1, search = load(out / "c1_openai_tiny.json"), load(out / "closed_search_openai_tiny.json")
    assert c1["config"]["api"] == "openai" and [lv["level"] for lv in c1["levels"]] == [1]
    assert c1["transport"] == {"connections_opened": 1, "requests": 2}
    assert search["search"]["kind"] == "closed" and search["levels"]
    # A closed level of c streams keeps c connections; the search's levels top out at the 2 slots.
    assert 1 <= search["transport"]["connections_opened"] <= 2 < search["transport"]["requests"]
    for doc in (c1, search):
        for level in doc["levels"]:
            assert level["aggregate"]["errors"] == 0, level["aggregate"]["errors_by_code"]
            for r in level["records"]:
                assert r["api"] == "openai" and r["ok"] and r["length_ok"] is True, r
                assert r["samples"] == FRAMES * SPF and 0 < r["ttfa_s"] <= r["e2e_s"] < 60
    summary = load(out / "summary.json")["models"]["qwen3-tts-tiny"]
    assert summary["c1_openai"]["transport"]["connections_opened"] == 1
    assert summary["c1_openai"]["ttfa_p50_ms"] > 0 and summary["closed_search_openai"]["levels"]
    assert "openai client, kept alive" in (out / "summary.md").read_text()


def test_closed_search_against_two_pairs_sharing_the_device(tmp_path: Path, cache: None) -> None:
    argv = ["--out", str(tmp_path), *BASE, "--phases", "closed,report", "--pairs", "2", "--closed-start", "2"]
    assert run_gpu.main([*argv, "--slots", "4"]) == 0
    meta = load(tmp_path / "serve_tiny_2pairs.json")
    assert meta["exit_code"] == 0 and meta["pairs"] == 2
    assert meta["slots"] == 4 and meta["slots_per_replica"] == 2
    for item in ("stages.0.replicas=2", "stages.1.replicas=2", "stages.0.max_num_seqs=2"):
        assert item in meta["command"]
    doc = load(tmp_path / "closed_search_tiny_2pairs.json")
    assert doc["search"]["kind"] == "closed" and doc["levels"][0]["level"] == 2  # --closed-start
    # Every level samples each process's CPU (issue 28): both pairs' stages by name, the gateway, the client.
    names = {"talker", "talker-1", "codec", "codec-1", "gateway", "client"}
    for level in doc["levels"]:
        procs = level["processes"]["processes"]
        assert set(procs) == names and all(procs[n]["cpu_pct"]["mean"] is not None for n in names)
    for level in doc["levels"]:
        assert level["aggregate"]["errors"] == 0
        for r in level["records"]:
            assert r["ok"] and r["frames"] == FRAMES and r["length_ok"] is True
        # ... and diffs each stage's metrics over it: every request's first chunk went through one codec.
        stages = level["stages"]
        assert set(stages) == {"talker-0", "talker-1", "codec-0", "codec-1"}
        assert all(stages[n]["tick_s"]["ticks"] > 0 for n in stages)
        firsts = sum(stages[f"codec-{k}"]["chunk_wait_s"]["first"]["count"] for k in (0, 1))
        assert firsts >= len(level["records"]) > 0
        decoded = sum(stages[f"codec-{k}"]["chunk_decode_s"]["first"]["count"] for k in (0, 1))
        assert decoded == firsts  # every chunk's wait has its decode's part
        # Every request's audio frames went through a decode call, counted with its padding.
        rows = [stages[f"codec-{k}"]["decode_rows"] for k in (0, 1)]
        assert sum(r["audio"] for r in rows) >= FRAMES * len(level["records"])
        assert all(r["calls"] > 0 and 0 <= r["padding_share"] < 1 for r in rows)
        for k in (0, 1):
            assert set(stages[f"codec-{k}"]["late_chunks"]) == {"frames", "codec"}
            assert stages[f"talker-{k}"]["paced"] == {"interval": 0.0, "ahead": 0.0}  # pacing is off
    # Both talker replicas served requests: the gateway spread the load over the two pairs.
    for k in (0, 1):
        prom = (tmp_path / f"metrics_tiny_2pairs_3closed_talker-{k}.prom").read_text()
        served = [ln for ln in prom.splitlines() if ln.startswith("voxstage_stage_requests_total")]
        assert served and sum(float(ln.rsplit(" ", 1)[1]) for ln in served) > 0, prom[:300]
    summary = load(tmp_path / "summary.json")["models"]
    assert summary["qwen3-tts-tiny_2pairs"]["closed_search"]["levels"]


def test_environment_names_the_code_that_ran_even_where_head_is_older(tmp_path: Path) -> None:
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    git("init", "-q")
    git("config", "user.email", "ci@example.invalid")
    git("config", "user.name", "ci")
    (tmp_path / ".gitignore").write_text("ignored/\n")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "-A")
    git("commit", "-qm", "base")
    assert run_gpu.worktree_tree(tmp_path) == git("rev-parse", "HEAD^{tree}")
    # A newer tree copied over the old checkout: a changed file, a new one, and ignored output.
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "b.py").write_text("y = 1\n")
    (tmp_path / "ignored").mkdir()
    (tmp_path / "ignored" / "out.json").write_text("{}")
    ran = run_gpu.worktree_tree(tmp_path)
    assert ran != git("rev-parse", "HEAD^{tree}") and git("status", "--porcelain") != ""
    assert git("diff", "--cached", "--name-only") == ""  # the real index is untouched
    git("add", "-A")
    git("commit", "-qm", "newer")
    assert ran == git("rev-parse", "HEAD^{tree}")  # the commit with that content has that tree


def test_environment_without_a_repository_says_none(tmp_path: Path) -> None:
    assert run_gpu.worktree_tree(tmp_path) is None  # pytest's tmp dirs lie outside any checkout
