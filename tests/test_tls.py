"""TLS and vLLM's own API key, end to end: a server started with `vllm serve`'s ``--ssl-keyfile``,
``--ssl-certfile`` and ``--api-key``, reached by the ``openai`` client over verified https."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from engine.default_model import MODEL_NAME
from load.server import ServerProcess

pytestmark = pytest.mark.engine

API_KEY = "tls-test-key"


def _self_signed(directory: Path) -> tuple[Path, Path]:
    """A key and a self-signed certificate for 127.0.0.1, made by the openssl command."""
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=phasespec-test",
         "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return key, cert


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    directory = tmp_path_factory.mktemp("tls")
    key, cert = _self_signed(directory)
    flags = ("--ssl-keyfile", str(key), "--ssl-certfile", str(cert), "--api-key", API_KEY)
    proc = ServerProcess(*flags, log_path=directory / "server.log", tls_ca=cert)
    proc.start()
    yield proc
    proc.stop()


def test_the_openai_client_verifies_the_certificate_and_chats_over_https(tls_server: ServerProcess) -> None:
    assert tls_server.base_url.startswith("https://")
    client = openai.OpenAI(
        base_url=f"{tls_server.base_url}/v1",
        api_key=API_KEY,
        http_client=openai.DefaultHttpxClient(verify=tls_server.verify),
    )
    reply = client.chat.completions.create(
        model=MODEL_NAME, messages=[{"role": "user", "content": "Say hi."}], max_tokens=8, temperature=0
    )
    assert reply.usage is not None and reply.usage.completion_tokens > 0


def test_plain_http_and_an_untrusted_certificate_get_nothing(tls_server: ServerProcess) -> None:
    plain = tls_server.base_url.replace("https://", "http://")
    try:
        status = httpx.get(f"{plain}/health", timeout=10).status_code
    except httpx.HTTPError:
        status = None
    assert status != 200, "plain http must not be served on a TLS port"
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{tls_server.base_url}/health", timeout=10)  # the system's CAs do not know it


def test_vllm_api_key_guards_v1_routes_and_not_health(tls_server: ServerProcess) -> None:
    url, verify = tls_server.base_url, tls_server.verify
    assert httpx.get(f"{url}/v1/models", verify=verify).status_code == 401
    wrong = httpx.get(f"{url}/v1/models", verify=verify, headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    good = httpx.get(f"{url}/v1/models", verify=verify, headers={"Authorization": f"Bearer {API_KEY}"})
    assert good.status_code == 200 and good.json()["data"][0]["id"] == MODEL_NAME
    assert httpx.get(f"{url}/health", verify=verify).status_code == 200
