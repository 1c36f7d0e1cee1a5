"""Two network namespaces wired like two hosts, for the multi-host test (ARCHITECTURE.md §8).

Three veth pairs: test (root namespace) <-> talker, test <-> codec, codec <-> talker. The talker and codec
see each other only through their own link, and the test reaches each through its own, so the codec ->
talker stream crosses a real (virtual) network interface instead of loopback. Needs root and ``ip``; when
that fails the caller falls back to distinct loopback addresses.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass


@dataclass(frozen=True)
class Hosts:
    talker_ns: str | None
    codec_ns: str | None
    talker_listen: str
    codec_listen: str
    talker_from_test: str  # address the test uses for the talker's health/Status
    codec_from_test: str
    talker_from_codec: str  # the talker_address the codec dials
    tag: str = ""

    def teardown(self) -> None:
        for ns in (self.talker_ns, self.codec_ns):
            if ns is not None:
                subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        if self.tag:  # root-namespace ends of pairs whose peer never moved into a namespace
            for dev in ("rt", "rc", "ct"):
                subprocess.run(["ip", "link", "del", self.tag + dev], check=False, capture_output=True)


LOOPBACK = Hosts(None, None, "127.0.0.2", "127.0.0.3", "127.0.0.2", "127.0.0.3", "127.0.0.2")


def make_hosts() -> tuple[Hosts, str]:
    """Namespaces if possible, else distinct loopback addresses; the string says which and why."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return LOOPBACK, "loopback addresses (not root or no `ip`)"
    tag = f"vx{os.getpid() % 100000}"
    t, c = f"{tag}t", f"{tag}c"
    # Subnet per test process so concurrent runs on one machine do not collide.
    net = 16 + os.getpid() % 200
    steps = [
        ["ip", "netns", "add", t],
        ["ip", "netns", "add", c],
        ["ip", "link", "add", f"{tag}rt", "type", "veth", "peer", "name", f"{tag}tr"],
        ["ip", "link", "add", f"{tag}rc", "type", "veth", "peer", "name", f"{tag}cr"],
        ["ip", "link", "add", f"{tag}ct", "type", "veth", "peer", "name", f"{tag}tc"],
        ["ip", "link", "set", f"{tag}tr", "netns", t],
        ["ip", "link", "set", f"{tag}tc", "netns", t],
        ["ip", "link", "set", f"{tag}cr", "netns", c],
        ["ip", "link", "set", f"{tag}ct", "netns", c],
        ["ip", "addr", "add", f"10.{net}.1.1/24", "dev", f"{tag}rt"],
        ["ip", "addr", "add", f"10.{net}.2.1/24", "dev", f"{tag}rc"],
        ["ip", "-n", t, "addr", "add", f"10.{net}.1.2/24", "dev", f"{tag}tr"],
        ["ip", "-n", t, "addr", "add", f"10.{net}.3.2/24", "dev", f"{tag}tc"],
        ["ip", "-n", c, "addr", "add", f"10.{net}.2.3/24", "dev", f"{tag}cr"],
        ["ip", "-n", c, "addr", "add", f"10.{net}.3.3/24", "dev", f"{tag}ct"],
        ["ip", "link", "set", f"{tag}rt", "up"],
        ["ip", "link", "set", f"{tag}rc", "up"],
        *[["ip", "-n", ns, "link", "set", dev, "up"] for ns, dev in ((t, f"{tag}tr"), (t, f"{tag}tc"))],
        *[["ip", "-n", ns, "link", "set", dev, "up"] for ns, dev in ((c, f"{tag}cr"), (c, f"{tag}ct"))],
        ["ip", "-n", t, "link", "set", "lo", "up"],
        ["ip", "-n", c, "link", "set", "lo", "up"],
    ]
    hosts = Hosts(t, c, "0.0.0.0", "0.0.0.0", f"10.{net}.1.2", f"10.{net}.2.3", f"10.{net}.3.2", tag)
    for step in steps:
        done = subprocess.run(step, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            hosts.teardown()
            return LOOPBACK, f"loopback addresses (`{' '.join(step)}` failed: {done.stderr.strip()})"
    return hosts, f"network namespaces {t} / {c}"
