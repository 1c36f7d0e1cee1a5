"""Seeded outputs of every family's tiny presets stay unchanged (tests/fingerprint.py says what is run).

The stored code hashes were computed before the issue-25 restructure (moves, renames, the family
descriptors), which had to leave every sampled code bit unchanged; PCM is compared by sketch, within CPU
rounding. A change that alters outputs on purpose rewrites them with
``python -m tests.fingerprint --write`` and says why in its commit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fingerprint import fingerprints, same, stored


def test_seeded_outputs_of_every_family_are_unchanged(tmp_path_factory: pytest.TempPathFactory) -> None:
    found = fingerprints(Path(tmp_path_factory.mktemp("presets")))
    expected = stored()
    assert found.keys() == expected.keys()
    changed = sorted(k for k in expected if not same(found[k], expected[k]))
    assert not changed, f"outputs changed: {changed}"
