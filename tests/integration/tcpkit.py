"""TCP_NODELAY of sockets that other processes hold, read from the outside (issue 29).

A server's accepted socket lives in the server's process. ``/proc/net/tcp{,6}`` gives a connection's socket
inode from its ports; ``/proc/<pid>/fd`` gives the descriptor that holds that inode; ``pidfd_getfd(2)``
(Linux 5.6+) copies the descriptor into this process, where ``getsockopt`` reads the option the server set.
The copy shares the socket: closing it leaves the server's connection alone.
"""

from __future__ import annotations

import ctypes
import errno
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

# pidfd_getfd(2): the generic syscall table's number, shared by x86_64 and aarch64.
SYS_PIDFD_GETFD = 438
ESTABLISHED, LISTEN = "01", "0A"  # /proc/net/tcp's st column
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Conn:
    local_port: int
    remote_port: int
    state: str
    inode: int


def connections() -> list[Conn]:
    """Every TCP socket on this host (IPv4 and IPv6), as the kernel lists them."""
    out: list[Conn] = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            f = line.split()
            local, remote = f[1].rsplit(":", 1)[1], f[2].rsplit(":", 1)[1]
            out.append(Conn(int(local, 16), int(remote, 16), f[3], int(f[9])))
    return out


def socket_fds(pid: int) -> dict[int, int]:
    """Socket inode -> descriptor number, for the sockets ``pid`` holds now."""
    found: dict[int, int] = {}
    base = Path(f"/proc/{pid}/fd")
    for entry in os.listdir(base):
        try:
            target = os.readlink(base / entry)
        except OSError:  # closed while we looked
            continue
        if target.startswith("socket:["):
            found[int(target[8:-1])] = int(entry)
    return found


def listening_ports(pid: int) -> set[int]:
    held = socket_fds(pid)
    return {c.local_port for c in connections() if c.state == LISTEN and c.inode in held}


def established(pid: int) -> list[Conn]:
    held = socket_fds(pid)
    return [c for c in connections() if c.state == ESTABLISHED and c.inode in held]


def pids_holding(inode: int) -> list[int]:
    """Processes with a descriptor on the socket ``inode`` (other users' processes are not readable)."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if inode in socket_fds(int(entry)):
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def nodelay(pid: int, fd: int) -> bool | None:
    """TCP_NODELAY of descriptor ``fd`` of ``pid``; None when it closed meanwhile. Skips the test, with the
    reason, where the kernel refuses to lend a descriptor (no pidfd_getfd, or no ptrace rights)."""
    pidfd = os.pidfd_open(pid)
    try:
        copy = _LIBC.syscall(SYS_PIDFD_GETFD, pidfd, fd, 0)
        if copy < 0:
            err = ctypes.get_errno()
            if err == errno.EBADF:
                return None
            pytest.skip(
                f"the kernel refuses pidfd_getfd ({errno.errorcode.get(err, err)}: {os.strerror(err)}), so "
                f"another process's socket options cannot be read here (kernel {os.uname().release})"
            )
    finally:
        os.close(pidfd)
    with socket.socket(fileno=copy) as sock:
        return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


def server_side(server_port: int, client_port: int) -> Conn | None:
    """The accepted end of the connection from ``client_port`` to ``server_port``."""
    for c in connections():
        if c.local_port == server_port and c.remote_port == client_port and c.state == ESTABLISHED:
            return c
    return None


def accepted_nodelay(pid: int, server_port: int, client_port: int, *, timeout_s: float = 5.0) -> str:
    """Wait until ``pid`` holds the accepted end of ``client_port`` -> ``server_port`` with TCP_NODELAY set;
    returns "" then, or what it saw at the deadline (a server may set the option just after accept)."""
    deadline = time.monotonic() + timeout_s
    seen = "no accepted socket"
    while True:
        conn = server_side(server_port, client_port)
        fd = None if conn is None else socket_fds(pid).get(conn.inode)
        if fd is not None:
            on = nodelay(pid, fd)
            if on:
                return ""
            seen = f"fd {fd} of pid {pid}: TCP_NODELAY {'closed' if on is None else 'off'}"
        if time.monotonic() > deadline:
            return f"port {server_port} <- {client_port}: {seen}"
        time.sleep(0.05)


def h2_preface(port: int) -> socket.socket:
    """A client connection past the HTTP/2 preface: the server has accepted it and set it up (gRPC)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
    assert len(sock.recv(9)) > 0, f"port {port}: no HTTP/2 frame back"
    return sock


def http_get(port: int, path: str) -> socket.socket:
    """A kept-alive HTTP/1.1 connection after one whole ``GET path`` (status line and headers read)."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        piece = sock.recv(65536)
        assert piece, f"port {port}: closed before the response head"
        head += piece
    assert head.startswith(b"HTTP/1.1 200"), head[:200]
    return sock
