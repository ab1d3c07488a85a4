"""One logging pipeline for phasespec, vLLM and uvicorn.

structlog renders every record: JSON lines when stderr is not a terminal,
readable console output when it is. vLLM configures logging in each of its
processes (this one and the engine core it spawns) from
``VLLM_LOGGING_CONFIG_PATH``; pointing that at our dictConfig puts the engine
core's records through the same formatter.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging.config
import os
import sys
import tempfile
from typing import Any

import structlog

_SHARED: list[Any] = [
    structlog.contextvars.merge_contextvars,
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso", utc=True),
]


def formatter(json_output: bool) -> structlog.stdlib.ProcessorFormatter:
    """dictConfig factory: stdlib records (vLLM, uvicorn) rendered by structlog."""
    renderer: Any = structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    processors: list[Any] = [structlog.stdlib.ProcessorFormatter.remove_processors_meta]
    if json_output:
        processors.append(structlog.processors.format_exc_info)
    processors.append(renderer)
    return structlog.stdlib.ProcessorFormatter(foreign_pre_chain=_SHARED, processors=processors)


def logging_config(json_output: bool, level: str) -> dict[str, Any]:
    handler = {"class": "logging.StreamHandler", "formatter": "phasespec", "stream": "ext://sys.stderr"}
    named = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"phasespec": {"()": "proxy.logs.formatter", "json_output": json_output}},
        "handlers": {"default": handler},
        "root": {"handlers": ["default"], "level": level.upper()},
        "loggers": {name: dict(named) for name in ("vllm", "uvicorn", "uvicorn.error", "uvicorn.access")},
    }


def configure_logging(level: str = "info", json_output: bool | None = None) -> dict[str, Any]:
    """Configure once, before vLLM is imported; returns the dictConfig (for uvicorn)."""
    json_output = not sys.stderr.isatty() if json_output is None else json_output
    config = logging_config(json_output, level)
    with tempfile.NamedTemporaryFile("w", prefix="phasespec-logging-", suffix=".json", delete=False) as file:
        json.dump(config, file)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = file.name
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    # vLLM's serving layer imports model_hosting_container_standards, whose import sets the root
    # logger and its handlers to ERROR (SAGEMAKER_CONTAINER_LOG_LEVEL, default ERROR): every
    # warning before uvicorn configures logging again was lost (the startup emulation warning
    # among them). Imported first, its setting is overridden by the configuration below.
    with contextlib.suppress(ImportError):
        importlib.import_module("model_hosting_container_standards.logging_config")
    logging.config.dictConfig(config)
    structlog.configure(
        processors=[*_SHARED, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    return config
