"""One place per family: no code outside a family's own folders and the registry names a family.

A family's code names (``qwen3``, ``audio8``, ``arktts``, ``personaplex`` and its codec ``mimi``, lowercase as
code spells them) may appear only in the family's folders (the packages its descriptor's loaders live in),
the registry (``src/voxstage/families``), deploy files, docs and tests, and in the tools that exist for one
family only (``FAMILY_TOOLS``: golden-fixture builders, benchmarks against a family's reference). Prose
names (Qwen3-TTS, PersonaPlex) in comments are allowed: they explain, they dispatch nothing. Everything
else asks the registry, so adding a family is a folder per stage, a descriptor and a registry line.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from voxstage import families

ROOT = Path(__file__).resolve().parents[2]
CODE_NAMES = re.compile(r"qwen3|audio8|arktts|personaplex|mimi")
# Trees and files that may name families: the registry, deploy files, docs, tests.
ALLOWED_TREES = ("src/voxstage/families/", "deploy/", "docs/", "tests/", "bench/results/")
ALLOWED_FILES = ("README.md", "Dockerfile", "docker-compose.yml", ".dockerignore", ".gitignore")
# Tools that exist for one family (or compare families' codecs on purpose): they drive its model code or
# its reference implementation directly, so they name it; none is on any serving path.
FAMILY_TOOLS = (
    "bench/audio8_gpu.py",  # Audio8-TTS talker and codec on the GPU
    "bench/codec_precision.py",  # the TTS codecs' bf16 error against fp32
    "bench/engine_gpu.py",  # the Qwen3-TTS talker engine on the GPU
    "bench/export_reference_weights.py",  # a Qwen3-TTS preset in the reference's checkpoint layout
    "bench/kernel_stats.py",  # kernel counts of the families' graphed frame steps
    "bench/kv_fp8.py",  # fp8 KV error and frame time of the families with an fp8 cache, golden and presets
    "bench/kv_fp8_families.py",  # its per-family drivers (the stage's own adapters, prompts, fixtures)
    "bench/mimi_step_ops.py",  # PersonaPlex's codec step, op by op
    "bench/personaplex_gpu.py",  # PersonaPlex against moshi on the GPU
    "bench/profile_gpu.py",  # the fused kernels on and off, per family
    "bench/reference_moshi.py",  # PersonaPlex's reference (moshi)
    "bench/reference_qwen_tts.py",  # Qwen3-TTS's reference (qwen-tts)
    "bench/run_gpu_pair.sh",  # the Qwen3-TTS sizes on two GPUs at once
    "scripts/golden_personaplex_lm.py",
    "scripts/golden_personaplex_mimi.py",
    "scripts/golden_qwen3_tts_build.py",
    "scripts/golden_qwen3_tts_cases.py",
    "scripts/golden_qwen3_tts_reference.py",
    "scripts/golden_qwen3_tts_weights.py",
    "scripts/make_golden_audio8_tts.py",
    "scripts/make_golden_personaplex.py",
    "scripts/make_golden_qwen3_tts.py",
)


def family_folders() -> set[str]:
    """Each registered family's packages in both stages (where its descriptor's loaders live)."""
    folders = set()
    for fam in families.families():
        for ref in (fam.talker, fam.codec, *fam.preset_writers):
            module = ref.partition(":")[0]
            folders.add(module.rpartition(".")[0].replace(".", "/") + "/")
    return folders


def tracked_files() -> list[str]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if line]


def test_no_code_outside_a_family_folder_names_a_family() -> None:
    folders = family_folders()
    assert len(folders) >= 2 * len(families.families()) - 1  # the checks below see every family's folders
    found = []
    for name in tracked_files():
        allowed = name in (*ALLOWED_FILES, *FAMILY_TOOLS) or name.endswith(".md")  # Markdown is docs
        if allowed or name.startswith((*ALLOWED_TREES, *folders)):
            continue
        path = ROOT / name
        if not path.is_file() or path.suffix in (".npz", ".png", ".gz", ".xz", ".pt"):
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found += [
            f"{name}:{number}: {line.strip()}"
            for number, line in enumerate(text.splitlines(), 1)
            if CODE_NAMES.search(line)
        ]
    assert not found, "family names outside the families' folders:\n" + "\n".join(found)


def test_the_family_tools_exist() -> None:
    tracked = set(tracked_files())
    assert not [tool for tool in FAMILY_TOOLS if tool not in tracked]
