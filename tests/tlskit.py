"""Throwaway certificates for the TLS tests, made with the ``openssl`` command (``cryptography`` is not in
the venv): a self-signed certificate for the public ports, and small PKIs (a CA and the leaf certificates it
signs) for mutual TLS on the stage links. Without ``openssl`` the tests that need them are skipped."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"]


def _openssl() -> str:
    found = shutil.which("openssl")
    if found is None:
        pytest.skip("no way to make a test certificate: neither cryptography nor the openssl command")
    return found


def _run(*args: str) -> None:
    subprocess.run([_openssl(), *args], check=True, capture_output=True)


def self_signed(directory: Path) -> tuple[Path, Path]:
    """``(cert, key)``: a self-signed certificate for 127.0.0.1 and localhost."""
    cert, key = directory / "cert.pem", directory / "key.pem"
    san = "subjectAltName=DNS:localhost,IP:127.0.0.1"
    out = ["-keyout", str(key), "-out", str(cert)]
    _run("req", "-x509", *_EC, "-subj", "/CN=localhost", "-addext", san, *out)
    return cert, key


@dataclass(frozen=True)
class Leaf:
    cert: Path
    key: Path


@dataclass(frozen=True)
class Authority:
    """A CA that can sign leaf certificates."""

    cert: Path
    key: Path
    directory: Path

    def issue(self, name: str, sans: str = "DNS:localhost,IP:127.0.0.1") -> Leaf:
        """A leaf for ``name`` good for both ends of a TLS link (a codec serves and dials)."""
        key, csr, cert = (self.directory / f"{name}.{ext}" for ext in ("key", "csr", "pem"))
        ext = self.directory / f"{name}.ext"
        ext.write_text(
            f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            "extendedKeyUsage=serverAuth,clientAuth\n"
        )
        _run("req", "-new", *_EC[:-2], "-subj", f"/CN={name}", "-keyout", str(key), "-out", str(csr))
        _run("x509", "-req", "-in", str(csr), "-CA", str(self.cert), "-CAkey", str(self.key), "-days", "1",
             "-set_serial", str(secrets.randbits(63)), "-extfile", str(ext), "-out", str(cert))  # fmt: skip
        return Leaf(cert, key)


def authority(directory: Path, name: str = "test-ca") -> Authority:
    directory.mkdir(parents=True, exist_ok=True)
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    usage = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"]
    _run("req", "-x509", *_EC, "-subj", f"/CN={name}", *usage, "-keyout", str(key), "-out", str(cert))
    return Authority(cert, key, directory)
