from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server import ServerProcess


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The one real server (and engine) of the test session, on the embedded model."""
    proc = ServerProcess(log_path=tmp_path_factory.mktemp("server") / "server.log")
    proc.start()
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def base_url(server: ServerProcess) -> str:
    return server.base_url


@pytest.fixture(scope="session")
def model_name() -> str:
    from engine.default_model import MODEL_NAME

    return MODEL_NAME


@pytest.fixture(scope="session")
def server_log(server: ServerProcess) -> Path:
    return server.log_path
