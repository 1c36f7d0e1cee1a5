"""bench/open_path.py pairs each open with the next first text of the talker, on one clock."""

from __future__ import annotations

import pytest

from bench.open_path import intervals

LOG = """\
$ python -m voxstage serve ...
STAMP 10.000000 1 gateway.open
noise line
STAMP 10.004000 2 talker.text
STAMP 10.005000 2 talker.text
STAMP 11.000000 1 gateway.open
STAMP 11.002500 2 talker.text
"""


def test_each_open_pairs_with_the_next_first_text_only() -> None:
    assert intervals(LOG) == pytest.approx([4.0, 2.5])
    assert intervals("") == []
