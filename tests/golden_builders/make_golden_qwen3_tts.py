#!/usr/bin/env python3
"""Build the Qwen3-TTS golden fixtures from the reference implementation.

    python tests/golden_builders/make_golden_qwen3_tts.py [--venv DIR] [--out tests/fixtures/qwen3_tts]

Creates (or reuses) a throwaway venv holding the reference ``qwen-tts`` 0.1.1 (installed ``--no-deps``)
under transformers 4.57.3, then re-runs itself there with ``--inner`` to draw tiny grid-valued weights,
write them in the real checkpoint layout, load that checkpoint with the reference's own ``from_pretrained``
and record its outputs. The reference is never a voxstage dependency. Reruns give byte-identical files.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import golden_venv  # noqa: E402  (a sibling script, importable once the folder is on the path)

REPO = Path(__file__).resolve().parents[2]
DEFAULT_VENV = Path("/tmp/voxstage-golden-venv")
DEFAULT_OUT = REPO / "tests" / "fixtures" / "qwen3_tts"
# What the reference needs to import and run on the paths used here (models.md §1.7). sox, torchaudio,
# onnxruntime and gradio are only used by the 25 Hz tokenizer and the demo: stubbed in-process instead.
REQUIREMENTS = [
    "torch==2.13.0",
    "transformers==4.57.3",
    "accelerate==1.12.0",
    "huggingface_hub==0.36.2",
    "tokenizers==0.22.2",
    "safetensors==0.8.0",
    "numpy==2.4.6",
    "einops==0.8.2",
    "librosa==0.11.0",  # the speaker encoder's mel filterbank
    "soundfile==0.14.0",
]
# Installed --no-deps: qwen-tts pins gradio, torchaudio, sox and onnxruntime, none of which the 12 Hz paths
# use.
REFERENCE = "qwen-tts==0.1.1"


def stub_unused_modules() -> None:
    """``import qwen_tts`` pulls in the 25 Hz tokenizer, which imports sox, onnxruntime and torchaudio at
    module level; nothing used here calls them. transformers probes torchaudio with find_spec, so it must be
    imported before the stubs exist and the stubs need a spec."""
    import importlib.machinery
    import types

    import transformers.utils.import_utils  # noqa: F401  (probe optional packages before stubbing)

    for name in ("sox", "onnxruntime", "torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
        if name in sys.modules:
            continue
        module = types.ModuleType(name)
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)
        sys.modules[name] = module


def main(argv: list[str] | None = None) -> int:
    return golden_venv.run_in_venv(
        argv,
        script=__file__,
        doc=__doc__ or "",
        default_venv=DEFAULT_VENV,
        default_out=DEFAULT_OUT,
        requirements=REQUIREMENTS,
        no_deps=[REFERENCE],
        inner=_build,
    )


def _build(out: Path, command: str) -> None:
    """Inside the venv: stub what the reference imports but never uses here, then build the fixtures."""
    stub_unused_modules()
    from golden_qwen3_tts_build import build_fixtures

    build_fixtures(out, command=command)


if __name__ == "__main__":
    sys.exit(main())
