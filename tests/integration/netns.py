"""Network namespaces wired like hosts: two (``make_hosts``, pair B of test_stages.py, ARCHITECTURE.md §8),
or any number on one bridge (``make_lan``, test_multi_host.py).

``make_hosts``: three veth pairs: test (root namespace) <-> talker, test <-> codec, codec <-> talker. The
talker and codec see each other only through their own link, and the test reaches each through its own, so
the codec -> talker stream crosses a real (virtual) network interface instead of loopback. Needs root and
``ip``; when that fails the caller falls back to distinct loopback addresses.
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


@dataclass(frozen=True)
class Lan:
    """Network namespaces as hosts on one switched network: each host's veth is a port of a bridge in the
    root namespace, which holds ``gateway_ip`` (the test and a gateway run there). Hosts reach each other
    only through the bridge, never over loopback."""

    tag: str
    hosts: dict[str, tuple[str, str]]  # name -> (namespace, address)
    gateway_ip: str

    def ns(self, name: str) -> str:
        return self.hosts[name][0]

    def ip(self, name: str) -> str:
        return self.hosts[name][1]

    def teardown(self) -> None:
        for ns, _ in self.hosts.values():
            subprocess.run(["ip", "netns", "del", ns], check=False, capture_output=True)
        subprocess.run(["ip", "link", "del", f"{self.tag}br"], check=False, capture_output=True)


def make_lan(names: list[str]) -> tuple[Lan | None, str]:
    """One namespace per name on a bridge, or (None, why not): the caller skips, saying why."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return None, "needs root and `ip` to create network namespaces"
    tag = f"vl{os.getpid() % 100000}"
    net = 16 + os.getpid() % 200  # per test process, as make_hosts; .10 keeps clear of its subnets
    hosts = {name: (f"{tag}{i}", f"10.{net}.10.{11 + i}") for i, name in enumerate(names)}
    lan = Lan(tag, hosts, f"10.{net}.10.1")
    steps = [
        ["ip", "link", "add", f"{tag}br", "type", "bridge"],
        ["ip", "addr", "add", f"{lan.gateway_ip}/24", "dev", f"{tag}br"],
        ["ip", "link", "set", f"{tag}br", "up"],
    ]
    for i, (ns, ip) in enumerate(hosts.values()):
        outer, inner = f"{tag}h{i}", f"{tag}n{i}"
        steps += [
            ["ip", "netns", "add", ns],
            ["ip", "link", "add", outer, "type", "veth", "peer", "name", inner],
            ["ip", "link", "set", inner, "netns", ns],
            ["ip", "link", "set", outer, "master", f"{tag}br", "up"],
            ["ip", "-n", ns, "addr", "add", f"{ip}/24", "dev", inner],
            ["ip", "-n", ns, "link", "set", inner, "up"],
            ["ip", "-n", ns, "link", "set", "lo", "up"],
        ]
    for step in steps:
        done = subprocess.run(step, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            lan.teardown()  # deleting a namespace deletes its veth pair too
            return None, f"`{' '.join(step)}` failed: {done.stderr.strip()}"
    return lan, f"network namespaces {', '.join(ns for ns, _ in hosts.values())} on bridge {tag}br"
