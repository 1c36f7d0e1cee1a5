"""Where the stage processes of a benchmark stack sit on a multi-GPU host (issue 31): ``bench/run_gpu.py
--layout NAME[,NAME...]``.

A layout is nothing but deploy overrides (``--set``) on the seed file: ``stages.N.devices`` for one process
per stage, ``stages.N.replica_devices`` for a talker + codec pair per GPU (docs/configuration.md, "Replicas
on one host"). Every layout runs the same phases as the single-GPU rows and tags its files
``<size>_<layout>`` (``serve_0.6b_split.json``, ``realtime_<tag>_split.json``), so one output dir holds the
layouts side by side and ``bench/layout_report.py`` renders them in one table.

* ``one-gpu``: both stages on GPU 0 (the control: the single-GPU rows' shape, measured in the same session);
* ``split``: the talker on GPU 0, the codec on GPU 1 (no time-slicing between the two);
* ``pair-per-gpu``: a talker and a codec on each of GPUs 0 and 1, behind one gateway (two replicas of each
  stage; ``--slots`` is the total, split over the pairs as with ``--pairs``; each GPU holds one pair, so
  each replica keeps the deploy file's GPU fraction).

Device indices are into the launcher's ``CUDA_VISIBLE_DEVICES`` (``voxstage.placement``); on ``--device
cpu`` the same processes start and only the placement is moot, which is what the CPU smoke checks.
"""

from __future__ import annotations

import argparse
import copy
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    name: str
    talker: tuple[int, ...]  # GPU of each talker replica
    codec: tuple[int, ...]  # GPU of each codec replica
    what: str
    duplex: bool  # measured for a duplex model too (a duplex gateway admits one replica's slots only)

    @property
    def pairs(self) -> int:
        return len(self.talker)

    @property
    def gpus(self) -> int:
        return len({*self.talker, *self.codec})

    def sets(self) -> list[str]:
        """The ``voxstage serve --set`` items that place the stages."""
        out = []
        for stage, devices in ((0, self.talker), (1, self.codec)):
            if len(devices) == 1:
                out.append(f"stages.{stage}.devices={devices[0]}")
            else:
                out.append(f"stages.{stage}.replica_devices=[{','.join(str(d) for d in devices)}]")
        return out

    def shares_device(self) -> bool:
        """Whether two replicas of one stage share a GPU (then their GPU fractions must be split)."""
        return any(len(set(d)) < len(d) for d in (self.talker, self.codec))


LAYOUTS = {
    layout.name: layout
    for layout in (
        Layout("one-gpu", (0,), (0,), "talker and codec on GPU 0", duplex=True),
        Layout("split", (0,), (1,), "talker on GPU 0, codec on GPU 1", duplex=True),
        Layout("pair-per-gpu", (0, 1), (0, 1), "a talker + codec pair on each of GPU 0 and 1", duplex=False),
    )
}


def parse(text: str) -> list[Layout]:
    """``--layout``'s comma-separated names; an unknown one is refused with the known ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        raise SystemExit(f"--layout: unknown {', '.join(unknown)}; choose from {', '.join(LAYOUTS)}")
    if len(set(names)) != len(names):
        raise SystemExit(f"--layout: {text!r} names a layout twice")
    return [LAYOUTS[n] for n in names]


def tag_of(tag: str, layout: Layout | None) -> str:
    return tag if layout is None else f"{tag}_{layout.name}"


def layout_of(tag: str) -> tuple[str, Layout | None]:
    """``0.6b_split`` -> (``0.6b``, the split layout); a tag without a layout suffix -> (tag, None)."""
    base, sep, name = tag.rpartition("_")
    if sep and name in LAYOUTS:
        return base, LAYOUTS[name]
    return tag, None


def options(a: argparse.Namespace, layout: Layout | None) -> argparse.Namespace:
    """``run_gpu.py``'s options for one layout: its placement appended to ``--set``, its pair count."""
    out = copy.copy(a)
    out.layout_name = None if layout is None else layout.name
    if layout is None:
        return out
    out.set = [*a.set, *layout.sets()]
    out.pairs = layout.pairs
    out.pairs_share_device = layout.shares_device()
    return out
