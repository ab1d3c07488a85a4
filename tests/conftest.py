from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from load.server import ServerProcess

SESSION_ENGINE_FIXTURES = {"server", "base_url", "client", "server_log"}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that uses the session server needs the engine: mark it, so ``-m "not engine"``
    is the fast loop (modules that start engines of their own carry the mark themselves)."""
    for item in items:
        if SESSION_ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The one real server (and engine) of the test session, on the embedded model."""
    # A short warm-up: with a drafter that proposes every step (the self-draft) all of an adaptive
    # request's steps before its thinking budget can be random warm-up steps at the default 40.
    env = {"PHASESPEC_ADAPTIVE__SUMMARY_INTERVAL_S": "2", "PHASESPEC_ADAPTIVE__WARMUP_STEPS": "8"}
    proc = ServerProcess(log_path=tmp_path_factory.mktemp("server") / "server.log", env=env)
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


@pytest.fixture(scope="session")
def embedded_tokenizer() -> object:
    """The embedded model's tokenizer (builds the model directory if needed)."""
    from transformers import AutoTokenizer

    from config import Settings
    from engine.default_model import ensure_default_model

    return AutoTokenizer.from_pretrained(ensure_default_model(Settings().engine.cache_dir))
