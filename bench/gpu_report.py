"""Summarize a ``bench/run_gpu.py`` output directory: ``summary.json``, ``summary.md`` and plots.

    python -m bench.gpu_report OUT

Ratios are ours / reference (below 1 = we are faster) at batch 1 and 100 fixed frames:
* TTFA vs the reference's *first frame* (call start to the second talker step, the earliest boundary the
  package exposes; it has no audio yet) and vs its *first audio* (it streams nothing: the whole ``generate``
  plus one decode). Ours is client-observed first playable sample through the gateway at c=1.
* RTF: ours is client-observed end-to-end / audio; the reference's is ``generate`` wall / audio (no decode).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from bench import layout_report
from bench.pack_results import load_json
from voxstage import families


def _load(path: Path) -> dict[str, Any] | None:
    return load_json(path)  # packed (.json.xz) by an earlier run into the same dir, or not


def _agg(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    return doc["levels"][0]["aggregate"] if doc and doc.get("levels") else None


def _ms(x: float | None) -> float | None:
    return None if x is None else 1e3 * x


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _search(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    if not doc or not doc.get("search"):
        return None
    s = dict(doc["search"])
    best = [lv for lv in doc["levels"] if lv["level"] == s["best"] and lv["verdict"]["pass"]]
    if best:
        a = best[-1]["aggregate"]
        s["at_best"] = {
            "ttfa_p50_ms": _ms(a["ttfa_s"]["p50"]),
            "ttfa_p95_ms": _ms(a["ttfa_s"]["p95"]),
            "ttfa_p99_ms": _ms(a["ttfa_s"]["p99"]),
            "rtf_p50": a["rtf"]["p50"],
            "audio_s_per_s": a["audio_s_per_s"],
            "peak_in_flight": a["peak_in_flight"],
            "n": a["requests"],
            "audio_before_text_done_rate": _ratio(a.get("audio_before_text_done"), a["ok"]),
        }
    s["levels"] = [(lv["level"], lv["verdict"]["pass"], lv["verdict"]["reason"]) for lv in doc["levels"]]
    return s


def _llm_fields(a: dict[str, Any]) -> dict[str, Any]:
    """What only the LLM-rate mode measures: when the text was complete and whether audio came first."""
    text_done = a.get("text_done_s") or {}
    return {
        "text_done_p50_s": text_done.get("p50"),
        "audio_before_text_done": a.get("audio_before_text_done"),
        "audio_before_text_done_rate": _ratio(a.get("audio_before_text_done"), a["ok"]),
        "send_lag_max_ms": _ms(a.get("send_lag_max_s")),
    }


def llm_summary(out: Path, tag: str) -> dict[str, Any]:
    """The LLM-rate phases (``*_llm_<tag>.json``), keyed as the whole-text ones with ``_llm``."""
    s: dict[str, Any] = {}
    if a := _agg(_load(out / f"ttfa_1rps_llm_{tag}.json")):
        s["ttfa_1rps_llm"] = {f"{p}_ms": _ms(a["ttfa_s"][p]) for p in ("p50", "p90", "p95", "p99")}
        s["ttfa_1rps_llm"].update(
            underrun_rate=a["underrun_rate"], errors=a["errors_by_code"], n=a["requests"], **_llm_fields(a)
        )
    if a := _agg(_load(out / f"c1_llm_{tag}.json")):
        s["c1_llm"] = {
            "ttfa_p50_ms": _ms(a["ttfa_s"]["p50"]),
            "ttfa_p95_ms": _ms(a["ttfa_s"]["p95"]),
            "e2e_p50_s": a["e2e_s"]["p50"],
            "underrun_rate": a["underrun_rate"],
            "errors": a["errors_by_code"],
            "n": a["requests"],
            **_llm_fields(a),
        }
    for key in ("closed_search_llm", "poisson_search_llm"):
        if (found := _search(_load(out / f"{key}_{tag}.json"))) is not None:
            s[key] = found
    return s


def model_summary(out: Path, tag: str) -> dict[str, Any]:
    s: dict[str, Any] = {}
    if a := _agg(_load(out / f"ttfa_1rps_{tag}.json")):
        s["ttfa_1rps"] = {f"{p}_ms": _ms(a["ttfa_s"][p]) for p in ("p50", "p90", "p95", "p99")}
        s["ttfa_1rps"].update(underrun_rate=a["underrun_rate"], errors=a["errors_by_code"], n=a["requests"])
    for key in ("c1", "c1_seed_schedule", "c1_http", "c1_openai"):
        doc = _load(out / f"{key}_{tag}.json")
        if a := _agg(doc):
            s[key] = {
                "ttfa_p50_ms": _ms(a["ttfa_s"]["p50"]),
                "ttfa_p95_ms": _ms(a["ttfa_s"]["p95"]),
                "rtf_p50": a["rtf"]["p50"],
                "e2e_p50_s": a["e2e_s"]["p50"],
                "underrun_rate": a["underrun_rate"],
                "errors": a["errors_by_code"],
                "n": a["requests"],
            }
            if doc and "transport" in doc:  # the openai client's connections opened for its requests
                s[key]["transport"] = doc["transport"]
    s["poisson_search"] = _search(_load(out / f"poisson_search_{tag}.json"))
    s["closed_search"] = _search(_load(out / f"closed_search_{tag}.json"))
    s["closed_search_openai"] = _search(_load(out / f"closed_search_openai_{tag}.json"))
    s.update(llm_summary(out, tag))
    if eng := _load(out / f"engine_{tag}.json"):
        step = eng.get("talker_frame_step", {}).get("graph", {})
        s["engine"] = {
            "frame_step_graph_ms": {b: v["median_ms"] for b, v in step.items()},
            "codec_graph_ms": {
                k: v["median_ms"] for k, v in eng.get("codec_decode", {}).get("graph", {}).items()
            },
        }
    if ref := _load(out / f"reference_{tag}.json"):
        g = ref["generate"]
        s["reference"] = {
            "first_frame_ms": g["first_frame_ms"]["median"],
            "per_frame_ms": g["per_frame_ms"]["median"],
            "rtf": g["rtf"]["median"],
            "first_audio_ms": ref["first_audio_ms"],
            "prefill_ms": g["prefill_ms"]["median"],
        }
        ours_ttfa = s.get("c1", {}).get("ttfa_p50_ms")
        ours_rtf = s.get("c1", {}).get("rtf_p50")
        s["ratios_ours_over_reference"] = {
            "ttfa_vs_first_frame": _ratio(ours_ttfa, s["reference"]["first_frame_ms"]),
            "ttfa_vs_first_audio": _ratio(ours_ttfa, s["reference"]["first_audio_ms"]),
            "rtf": _ratio(ours_rtf, s["reference"]["rtf"]),
        }
    return s


def _fmt(x: Any, digits: int = 1) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| model | TTFA @1 rps p50 / p95 / p99 ms | c=1 TTFA p50 ms | c=1 RTF | max rate (req/s) |"]
    lines[0] += (
        " max streams | ref first frame / first audio ms | ref RTF | TTFA ratio (frame / audio) | RTF ratio |"
    )
    lines.append("|" + "---|" * 10)
    for model, s in summary["models"].items():
        t = s.get("ttfa_1rps", {})
        c1 = s.get("c1", {})
        ps, cs = s.get("poisson_search") or {}, s.get("closed_search") or {}
        ref, r = s.get("reference", {}), s.get("ratios_ours_over_reference", {})
        row = [
            model,
            f"{_fmt(t.get('p50_ms'))} / {_fmt(t.get('p95_ms'))} / {_fmt(t.get('p99_ms'))}",
            _fmt(c1.get("ttfa_p50_ms")),
            _fmt(c1.get("rtf_p50"), 3),
            f"{_fmt(ps.get('best'))} ({ps.get('limited_by', '–')})",
            f"{_fmt(cs.get('best'), 0)} ({cs.get('limited_by', '–')})",
            f"{_fmt(ref.get('first_frame_ms'))} / {_fmt(ref.get('first_audio_ms'))}",
            _fmt(ref.get("rtf"), 3),
            f"{_fmt(r.get('ttfa_vs_first_frame'), 3)} / {_fmt(r.get('ttfa_vs_first_audio'), 4)}",
            _fmt(r.get("rtf"), 3),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n" + faces_markdown(summary) + llm_markdown(summary) + pairs_markdown(summary)


def _best(search: dict[str, Any] | None, digits: int = 0) -> str:
    if not search:
        return "–"
    at = search.get("at_best") or {}
    ttfa = f", TTFA p50 {_fmt(at.get('ttfa_p50_ms'), 0)} ms" if at else ""
    return f"{_fmt(search.get('best'), digits)} ({search.get('limited_by', '–')}{ttfa})"


def faces_markdown(summary: dict[str, Any]) -> str:
    """c=1 first audio through each face (issue 29): gRPC, HTTP on a fresh connection per request, and the
    official ``openai`` client on kept-alive connections, for every model with an ``openai`` phase."""
    rows = []
    for model, s in summary["models"].items():
        oa = s.get("c1_openai")
        if not oa:
            continue
        grpc, http = s.get("c1") or {}, s.get("c1_http") or {}
        gap = None if grpc.get("ttfa_p50_ms") is None else oa["ttfa_p50_ms"] - grpc["ttfa_p50_ms"]
        kept = oa.get("transport") or {}
        rows.append(
            [
                model,
                *(f"{_fmt(c.get('ttfa_p50_ms'))} / {_fmt(c.get('ttfa_p95_ms'))}" for c in (grpc, http, oa)),
                "–" if gap is None else f"{gap:+.1f}",
                f"{kept.get('connections_opened', '–')} / {kept.get('requests', '–')}",
                f"{_best(s.get('closed_search'))}; {_best(s.get('closed_search_openai'))}",
            ]
        )
    head = ["model", "c=1 TTFA p50 / p95 ms: gRPC", "HTTP, fresh connections", "openai client, kept alive"]
    head += ["openai − gRPC p50 ms", "openai connections / requests", "max streams: gRPC; openai"]
    return _table(head, rows)


def _table(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table after a blank line, or nothing without rows."""
    if not rows:
        return ""
    lines = [head, ["---"] * len(head), *rows]
    return "\n" + "".join("| " + " | ".join(r) + " |\n" for r in lines)


def llm_markdown(summary: dict[str, Any]) -> str:
    """Whole text vs text streamed at an LLM's rate, one row each, for every model with LLM results."""
    rows = []
    for model, s in summary["models"].items():
        if not any(k.endswith("_llm") for k in s):
            continue
        for label, sfx in (("whole text", ""), ("LLM deltas", "_llm")):
            t, c1 = s.get(f"ttfa_1rps{sfx}") or {}, s.get(f"c1{sfx}") or {}
            early = t.get("audio_before_text_done")
            rows.append(
                [
                    model,
                    label,
                    f"{_fmt(t.get('p50_ms'))} / {_fmt(t.get('p95_ms'))} / {_fmt(t.get('p99_ms'))}",
                    _fmt(t.get("underrun_rate"), 3),
                    "–" if early is None else f"{early} of {t.get('n')}",
                    _fmt(c1.get("ttfa_p50_ms")),
                    _best(s.get(f"closed_search{sfx}")),
                    _best(s.get(f"poisson_search{sfx}"), 1),
                ]
            )
    head = ["model", "text", "TTFA @1 rps p50 / p95 / p99 ms", "underrun rate @1 rps"]
    head += ["first audio before last delta @1 rps", "c=1 TTFA p50 ms", "max streams (closed)"]
    return _table([*head, "max rate req/s (Poisson)"], rows)


def pairs_markdown(summary: dict[str, Any]) -> str:
    """One talker + codec pair vs N pairs sharing the GPU, for every ``<tag>_<N>pairs`` with its base."""
    models = summary["models"]
    rows = []
    for model, s in models.items():
        base, sep, pairs = model.rpartition("_")
        if not sep or not pairs.endswith("pairs") or not pairs[:-5].isdigit():
            continue
        for label, m in (("1", models.get(base) or {}), (pairs[:-5], s)):
            cs = m.get("closed_search") or {}
            at = cs.get("at_best") or {}
            rows.append(
                [
                    base,
                    label,
                    f"{_fmt(cs.get('best'), 0)} ({cs.get('limited_by', '–')})",
                    _fmt((m.get("ttfa_1rps") or {}).get("p50_ms")),
                    f"{_fmt(at.get('ttfa_p50_ms'))} / {_fmt(at.get('ttfa_p95_ms'))}",
                    _fmt(at.get("rtf_p50"), 3),
                    _fmt(at.get("audio_s_per_s")),
                ]
            )
    head = ["model", "pairs on the GPU", "max gap-free streams (closed)", "TTFA @1 rps p50 ms"]
    return _table([*head, "at best: TTFA p50 / p95 ms", "at best: RTF p50", "at best: audio s per s"], rows)


def model_name(tag: str) -> str:
    """The preset a result tag stands for: the tag with its family's tag prefix back (``0.6b`` ->
    ``<prefix>0.6b``, ``0.6b_2pairs`` likewise); a tag that is already a preset name stays as it is."""
    size = tag.split("_")[0]
    for fam in families.families():
        prefix = fam.bench.tag_prefix if fam.bench else ""
        if prefix and fam.preset(prefix + size) is not None:
            return prefix + tag
    return tag


def write_report(out: Path) -> dict[str, Any]:
    tags = sorted(
        {p.stem.removeprefix("serve_") for p in out.glob("serve_*.json")}
        | {p.stem.removeprefix("reference_") for p in out.glob("reference_*.json")}
        | {p.stem.removeprefix("engine_") for p in out.glob("engine_*.json")}
    )
    tags = [t for t in tags if not t.endswith("_failed")]
    summary = {
        "environment": _load(out / "environment.json"),
        "models": {model_name(t): model_summary(out, t) for t in tags},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    # The --layout runs side by side (issue 31), also on their own in layouts.md / layouts.json.
    placed = layout_report.markdown(layout_report.write_layout_report(out))
    text = markdown(summary) + ("\n" + placed if placed else "")
    (out / "summary.md").write_text(text)
    print(text, flush=True)
    try:
        from bench.plots import plot_files
    except ImportError:
        return summary
    for kind in ("poisson_search", "closed_search"):
        files = sorted(out.glob(f"{kind}_*.json"))
        if files:
            try:
                plot_files(files, out / "plots")
            except ImportError:  # matplotlib missing on the benchmark box: plot later from the JSON
                print("matplotlib not installed: run `python -m bench.plots` on the JSON later", flush=True)
                break
    return summary


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        raise SystemExit("usage: python -m bench.gpu_report OUT_DIR")
    write_report(Path(args[0]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
