"""A certificate authority, a server's certificate (for `localhost`) and a client's, made by
openssl in a folder, for the tests of Redis over TLS (tests/plumbing/test_redis_urls.py,
tests/plumbing/test_sentinel.py)."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)


@dataclass(frozen=True)
class Certificates:
    ca: Path
    stranger_ca: Path  # a CA that signed nothing the servers hold
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path


def make_certificates(directory: Path) -> Certificates:
    def key(name: str) -> Path:
        path = directory / f"{name}.key"
        openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                "-out", path)  # fmt: skip
        return path

    def authority(name: str) -> Path:
        cert = directory / f"{name}.crt"
        openssl("req", "-x509", "-new", "-key", key(name), "-out", cert, "-days", "2",
                "-subj", f"/CN={name}")  # fmt: skip
        return cert

    def signed(name: str, extensions: str) -> Path:
        cert, csr, ext = directory / f"{name}.crt", directory / f"{name}.csr", directory / name
        ext.write_text(extensions)
        openssl("req", "-new", "-key", key(name), "-out", csr, "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", csr, "-CA", directory / "ca.crt", "-CAkey",
                directory / "ca.key", "-CAcreateserial", "-out", cert, "-days", "2",
                "-extfile", ext)  # fmt: skip
        return cert

    ca, stranger = authority("ca"), authority("stranger")
    # The server's name is localhost only: 127.0.0.1 is another name.
    server = signed("server", "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n")
    client = signed("client", "extendedKeyUsage=clientAuth\n")
    return Certificates(
        ca=ca,
        stranger_ca=stranger,
        server_cert=server,
        server_key=directory / "server.key",
        client_cert=client,
        client_key=directory / "client.key",
    )
