"""Mutual TLS on the stage links (gateway -> talker, gateway -> codec, codec -> talker, and health probes).

Off by default: the stage ports speak plain gRPC on a private network or loopback. With a CA file, a
certificate and its key, a stage serves only clients that present a certificate the CA signed
(``require_client_auth``), and every client of a stage presents its own and checks the stage's against the
same CA. A process that both serves and dials (the codec) uses one certificate for both, so the
certificates need ``serverAuth`` and ``clientAuth`` usages unless their profile sets neither.

The stages are dialled by ``host:port``, so a server certificate must name that host (a SAN for the IP or
the DNS name in the address) unless ``server_name`` overrides the name checked: certificates issued to one
service name (``voxstage-stage``) then serve every address.

One set of names per front end (CLI flags, deploy keys), so an incomplete set is refused naming what is
missing in the words the operator typed.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

ChannelOptions = Sequence[tuple[str, Any]]


class LinkTlsError(ValueError):
    """The stage-link TLS settings cannot be used as given; the message names the flag or key."""


@dataclass(frozen=True)
class LinkNames:
    """How one front end spells the four settings, for error messages."""

    ca: str
    cert: str
    key: str
    server_name: str | None  # None: this front end has no server-name setting (it only serves)


CLI_NAMES = LinkNames("--link-ca", "--link-cert", "--link-key", "--link-server-name")
SERVER_CLI_NAMES = LinkNames("--link-ca", "--link-cert", "--link-key", None)
GATEWAY_KEYS = LinkNames(
    "gateway.link_ca_file", "gateway.link_cert_file", "gateway.link_key_file", "gateway.link_server_name"
)


@dataclass(frozen=True)
class LinkTls:
    """PEM material of one process's end of the stage links."""

    ca: bytes
    cert: bytes
    key: bytes
    server_name: str | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self.key, certificate_chain=self.cert
        )

    def channel_options(self) -> list[tuple[str, Any]]:
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def aio_channel(address: str, options: ChannelOptions, tls: LinkTls | None) -> grpc.aio.Channel:
    """A grpc.aio channel to a stage: plain without ``tls``, mutual TLS with it."""
    if tls is None:
        return grpc.aio.insecure_channel(address, options=list(options))
    opts = [*options, *tls.channel_options()]
    return grpc.aio.secure_channel(address, tls.channel_credentials(), options=opts)


def sync_channel(address: str, options: ChannelOptions, tls: LinkTls | None) -> grpc.Channel:
    """``aio_channel`` for blocking callers (health probes, the launcher)."""
    if tls is None:
        return grpc.insecure_channel(address, options=list(options))
    opts = [*options, *tls.channel_options()]
    return grpc.secure_channel(address, tls.channel_credentials(), options=opts)


def load_link_tls(
    ca: str | None,
    cert: str | None,
    key: str | None,
    server_name: str | None = None,
    *,
    names: LinkNames = CLI_NAMES,
) -> LinkTls | None:
    """Read the three PEM files, or None when none is set. A partial set, a server name without the files,
    an unreadable file or one that holds no PEM block is a ``LinkTlsError`` naming the setting."""
    files = {names.ca: ca, names.cert: cert, names.key: key}
    given = [name for name, value in files.items() if value]
    if not given:
        if server_name:
            raise LinkTlsError(
                f"{names.server_name} is set but mTLS on the stage links is off: it also needs "
                f"{', '.join(files)}"
            )
        return None
    missing = [name for name, value in files.items() if not value]
    if missing:
        raise LinkTlsError(
            f"{', '.join(given)} {'is' if len(given) == 1 else 'are'} set but {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not: mTLS on the stage links needs the CA file, the "
            "certificate and its key"
        )
    pems = {name: _read_pem(name, str(value)) for name, value in files.items()}
    if server_name is not None and not server_name.strip():
        raise LinkTlsError(f"{names.server_name}: empty; give the name the stage certificates carry")
    return LinkTls(pems[names.ca], pems[names.cert], pems[names.key], server_name or None)


def _read_pem(name: str, value: str) -> bytes:
    path = Path(value).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise LinkTlsError(f"{name}: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise LinkTlsError(f"{name}: {path} holds no PEM block (-----BEGIN ...)")
    return data


# -- command lines ------------------------------------------------------------------------------------------


def add_link_options(parser: argparse.ArgumentParser, *, client: bool, what: str = "this process") -> None:
    """``--link-ca/--link-cert/--link-key`` (and ``--link-server-name`` for a process that dials stages)."""
    group = parser.add_argument_group(
        "stage-link mTLS",
        f"Mutual TLS on the stage links of {what}: all three files or none (off: plain gRPC). See "
        "docs/operations.md, production profile.",
    )
    group.add_argument("--link-ca", default=None, metavar="PEM", help="CA that signs every stage certificate")
    group.add_argument("--link-cert", default=None, metavar="PEM", help="this process's certificate (chain)")
    group.add_argument("--link-key", default=None, metavar="PEM", help="the private key of --link-cert")
    if client:
        group.add_argument(
            "--link-server-name", default=None, metavar="NAME",
            help="the name the stages' certificates are checked against, instead of the host in the address",
        )  # fmt: skip


def link_from_args(args: argparse.Namespace) -> LinkTls | None:
    """The ``add_link_options`` flags, read and checked."""
    server_name = getattr(args, "link_server_name", None)
    names = CLI_NAMES if hasattr(args, "link_server_name") else SERVER_CLI_NAMES
    return load_link_tls(args.link_ca, args.link_cert, args.link_key, server_name, names=names)


def link_flags(
    ca: str | None, cert: str | None, key: str | None, server_name: str | None = None
) -> list[str]:
    """The flags that pass the same files on to a child process (``voxstage serve``)."""
    flags: list[str] = []
    for flag, value in (("--link-ca", ca), ("--link-cert", cert), ("--link-key", key)):
        if value:
            flags += [flag, value]
    if server_name:
        flags += ["--link-server-name", server_name]
    return flags


@dataclass(frozen=True)
class LaunchLink:
    """One set of stage-link files for every process ``voxstage serve`` starts: from its ``--link-*`` flags,
    else from the deploy file's ``gateway.link_*`` keys (so either switch alone turns it on everywhere)."""

    ca: str
    cert: str
    key: str
    server_name: str | None
    from_flags: bool
    tls: LinkTls  # what the launcher's own health probes present

    def stage_flags(self, *, client: bool) -> list[str]:
        return link_flags(self.ca, self.cert, self.key, self.server_name if client else None)

    def gateway_overrides(self) -> list[str]:
        """``--set`` flags for the gateway; none when the deploy file already names the files."""
        if not self.from_flags:
            return []
        keys = {"link_ca_file": self.ca, "link_cert_file": self.cert, "link_key_file": self.key,
                "link_server_name": self.server_name}  # fmt: skip
        # JSON strings are YAML double-quoted scalars: a path is never read as a number or a mapping.
        return [flag for k, v in keys.items() if v for flag in ("--set", f"gateway.{k}={json.dumps(v)}")]


def launch_link(args: argparse.Namespace, gw: Any) -> LaunchLink | None:
    """The launch's stage-link files (``gw``: the deploy file's ``GatewayConfig``), read and checked."""
    flags = (args.link_ca, args.link_cert, args.link_key, args.link_server_name)
    from_flags = any(flags)
    if from_flags:
        tls = load_link_tls(*flags, names=CLI_NAMES)
    else:
        flags = (gw.link_ca_file, gw.link_cert_file, gw.link_key_file, gw.link_server_name)
        tls = load_link_tls(*flags, names=GATEWAY_KEYS)
    if tls is None:
        return None
    ca, cert, key, server_name = flags
    assert ca and cert and key  # load_link_tls refused anything less
    return LaunchLink(ca, cert, key, server_name, from_flags, tls)
