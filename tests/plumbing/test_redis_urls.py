"""A Redis URL means the same to every client of the platform: redis-py (the model), the
asyncio client (plumbing/aio_redis.py), the fair queue's lean client (plumbing/raw_redis.py)
and Celery's broker connect with the same password, ACL user and TLS options, and fail where
redis-py fails (a wrong password, a certificate of another CA, another host name). Against
redis-server processes this file starts: one with `--requirepass` and an ACL user, and two
that serve only TLS (one of them wants a client certificate), with certificates made here by
openssl."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
import redis
import uvloop

from plumbing.aio_redis import AsyncRedis
from plumbing.raw_redis import RawRedis
from plumbing.redis import ssl_options
from tests.support.certificates import Certificates, make_certificates

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "s3cr@t:pa/ss%"  # characters a URL must escape
ALICE = "alice-pw"

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("openssl") is None,
    reason="redis-server and openssl",
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(directory: Path, port: int, *args: str) -> subprocess.Popen[bytes]:
    log = (directory / f"redis-{port}.log").open("wb")
    server = subprocess.Popen(
        ["redis-server", "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", str(directory), *args],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        assert server.poll() is None, (directory / f"redis-{port}.log").read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return server
        except OSError:
            time.sleep(0.05)
    server.kill()
    raise AssertionError(f"redis-server on {port} did not start")


@dataclass(frozen=True)
class Servers:
    certificates: Certificates
    password_port: int
    tls_port: int
    mtls_port: int  # wants a client certificate of the CA


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    directory = tmp_path_factory.mktemp("redis-auth-tls")
    certificates = make_certificates(directory)
    password_port, tls_port, mtls_port = free_port(), free_port(), free_port()
    tls = [
        "--tls-cert-file", str(certificates.server_cert),
        "--tls-key-file", str(certificates.server_key),
        "--tls-ca-cert-file", str(certificates.ca),
        "--requirepass", PASSWORD,
    ]  # fmt: skip
    started = [
        start_redis(
            directory, password_port, "--port", str(password_port),
            "--requirepass", PASSWORD,
            "--user", "alice", "on", f">{ALICE}", "~*", "&*", "+@all",
        ),
        start_redis(
            directory, tls_port, "--port", "0", "--tls-port", str(tls_port), *tls,
            "--tls-auth-clients", "no",
        ),
        start_redis(
            directory, mtls_port, "--port", "0", "--tls-port", str(mtls_port), *tls,
            "--tls-auth-clients", "yes",
        ),
    ]  # fmt: skip
    yield Servers(certificates, password_port, tls_port, mtls_port)
    for server in started:
        server.terminate()
        server.wait(10)


SECRET = quote(PASSWORD, safe="")

# (name, URL with {port}, {ca}, {stranger}, {cert}, {key} to fill, whether it connects)
PASSWORD_CASES = [
    ("password", f"redis://:{SECRET}@127.0.0.1:{{port}}/3", True),
    ("acl user", f"redis://alice:{ALICE}@127.0.0.1:{{port}}/3", True),
    ("db in the query", f"redis://:{SECRET}@127.0.0.1:{{port}}?db=4", True),
    ("wrong password", "redis://:wrong@127.0.0.1:{port}/3", False),
    ("wrong user", f"redis://bob:{ALICE}@127.0.0.1:{{port}}/3", False),
    ("no password", "redis://127.0.0.1:{port}/3", False),
]
TLS = f"rediss://:{SECRET}@localhost:{{port}}/2"
TLS_CASES = [
    ("tls", f"{TLS}?ssl_ca_certs={{ca}}", True),
    (
        "tls, all options",
        f"{TLS}?ssl_cert_reqs=required&ssl_ca_certs={{ca}}&ssl_check_hostname=true",
        True,
    ),
    ("tls, another ca", f"{TLS}?ssl_ca_certs={{stranger}}", False),
    ("tls, the system's cas", TLS, False),
    (
        "tls, another host name",
        f"rediss://:{SECRET}@127.0.0.1:{{port}}/2?ssl_ca_certs={{ca}}",
        False,
    ),
    (
        "tls, host name not checked",
        f"rediss://:{SECRET}@127.0.0.1:{{port}}/2?ssl_ca_certs={{ca}}&ssl_check_hostname=false",
        True,
    ),
    ("tls, nothing verified", f"rediss://:{SECRET}@127.0.0.1:{{port}}/2?ssl_cert_reqs=none", True),
    ("tls, wrong password", "rediss://:wrong@localhost:{port}/2?ssl_ca_certs={ca}", False),
]
# On the server that wants a client certificate.
MTLS_CASES = [
    (
        "mtls",
        f"{TLS}?ssl_ca_certs={{ca}}&ssl_certfile={{cert}}&ssl_keyfile={{key}}",
        True,
    ),
    ("mtls, no client certificate", f"{TLS}?ssl_ca_certs={{ca}}", False),
]


def fill(url: str, servers: Servers, server: str) -> str:
    c = servers.certificates
    return url.format(
        port=getattr(servers, f"{server}_port"),
        ca=c.ca, stranger=c.stranger_ca, cert=c.client_cert, key=c.client_key,
    )  # fmt: skip


def failure(call: object) -> str | None:
    """What kind of failure calling `call` meets: None when it succeeds."""
    try:
        call()  # type: ignore[operator]
    except redis.AuthenticationError:
        return "authentication"
    except redis.ConnectionError:
        return "connection"
    return None


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request):
    return asyncio.run if request.param == "asyncio" else uvloop.run


CASES = (
    [(name, url, ok, "password") for name, url, ok in PASSWORD_CASES]
    + [(name, url, ok, "tls") for name, url, ok in TLS_CASES]
    + [(name, url, ok, "mtls") for name, url, ok in MTLS_CASES]
)


@pytest.mark.parametrize(("name", "url", "ok", "server"), CASES, ids=[c[0] for c in CASES])
def test_a_url_connects_through_every_client_where_it_connects_through_redis_py(
    servers: Servers, run, name: str, url: str, ok: bool, server: str
) -> None:
    url = fill(url, servers, server)
    model = redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    expected = failure(lambda: model.set("written", name))
    assert (expected is None) is ok, (name, expected)

    async def through_aio() -> object:
        client = AsyncRedis(url, max_connections=2, read_timeout_s=5)
        try:
            return await client.call("GET", "written")
        finally:
            client.close()

    answers: list[object] = []
    assert failure(lambda: answers.append(run(through_aio()))) == expected, name
    if ok:  # the same server and database as redis-py's
        assert answers == [name.encode()]

    raw = RawRedis.like(model)
    # TLS is left to redis-py, which the fair queue runs on then (fairqueue/queue.py).
    if url.startswith("rediss://"):
        assert raw is None
    else:
        assert raw is not None
        assert failure(lambda: answers.append(raw.call("GET", "written"))) == expected, name
        if ok:
            assert answers[-1] == name.encode()
        raw.close()
    model.close()


def broker_round_trip(url: str) -> subprocess.CompletedProcess[str]:
    """A message through Celery's broker at REDIS_URL=url, the platform's own Celery app and
    settings in a process of their own."""
    script = (
        "import json\n"
        "from config.celery import app\n"
        "with app.connection_for_write() as conn:\n"
        "    conn.ensure_connection(max_retries=1)\n"
        "    queue = conn.SimpleQueue('gpushare-broker-tls-test')\n"
        "    queue.put({'n': 1})\n"
        "    message = queue.get(timeout=5)\n"
        "    message.ack()\n"
        "    print(json.dumps(message.payload))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("CELERY_")}
    env["REDIS_URL"] = url
    return subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("url", "server"), [(TLS_CASES[0][1], "tls"), (MTLS_CASES[0][1], "mtls")], ids=["tls", "mtls"]
)
def test_celerys_broker_takes_the_password_and_tls_options_of_the_url(
    servers: Servers, url: str, server: str
) -> None:
    done = broker_round_trip(fill(url, servers, server))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"n": 1}


def test_celerys_broker_verifies_the_servers_certificate_as_redis_py_does(
    servers: Servers,
) -> None:
    """kombu alone takes a rediss:// URL without `ssl_cert_reqs` as one that verifies
    nothing; the platform's broker verifies as redis-py does."""
    for name, url, ok in TLS_CASES:
        if name in ("tls, the system's cas", "tls, another ca", "tls, another host name"):
            assert not ok
            done = broker_round_trip(fill(url, servers, "tls"))
            assert done.returncode != 0, (name, done.stdout)
            assert "certificate verify failed" in done.stderr, (name, done.stderr[-2000:])


def test_ssl_options_are_redis_pys_reading_of_the_url() -> None:
    assert ssl_options("redis://:pw@host:6379/0") is None
    assert ssl_options("unix:///run/redis.sock") is None
    assert ssl_options("amqp://guest@rabbit//") is None  # a broker that is not Redis
    assert ssl_options("sentinel://:pw@s1:26379;sentinel://:pw@s2:26379") is None
    assert ssl_options("rediss://a:6380/0?ssl_ca_certs=/ca.pem;rediss://b:6380/0") == {
        "ssl_cert_reqs": "required",
        "ssl_ca_certs": "/ca.pem",
    }
    assert ssl_options("rediss://host:6380/0") == {"ssl_cert_reqs": "required"}
    assert ssl_options(
        "rediss://host/0?ssl_cert_reqs=none&ssl_ca_certs=/etc/ca%20file.pem"
        "&ssl_check_hostname=false&socket_timeout=3"
    ) == {
        "ssl_cert_reqs": "none",
        "ssl_ca_certs": "/etc/ca file.pem",
        "ssl_check_hostname": False,
    }
