"""``phasespec``: start the server (``--help`` for settings, ``--vllm-help`` for engine flags)."""

from __future__ import annotations

import sys

import uvicorn

from config import Settings


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--vllm-help" in argv:
        from engine.args import vllm_parser

        vllm_parser().print_help()
        return
    settings = Settings(_cli_parse_args=argv)  # type: ignore[call-arg]
    from proxy.logs import configure_logging

    log_config = configure_logging(settings.server.log_level)  # before vLLM is imported

    from engine.args import SettingsError
    from proxy.app import create_app

    try:
        app = create_app(settings)
    except SettingsError as exc:
        sys.exit(f"phasespec: {exc}")
    server = uvicorn.Server(
        uvicorn.Config(
            app,
            host=settings.server.host,
            port=settings.server.port,
            log_level=settings.server.log_level,
            log_config=log_config,
            timeout_graceful_shutdown=10,
        )
    )
    app.state.request_exit = lambda: setattr(server, "should_exit", True)
    server.run()
    if app.state.engine_died:
        sys.exit(1)  # a supervisor restarts a process that failed


if __name__ == "__main__":
    main()
