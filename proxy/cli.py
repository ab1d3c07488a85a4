"""``phasespec``: start the server (``--help`` for settings, ``--vllm-help`` for engine flags)."""

from __future__ import annotations

import signal
import sys
from types import FrameType

import uvicorn

from config import Settings


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--vllm-help" in argv:
        from engine.args import vllm_parser

        vllm_parser().print_help()
        return
    try:
        settings = Settings.from_command_line(argv)
    except ValueError as exc:  # pydantic's ValidationError is one
        sys.exit(f"phasespec: invalid settings: {exc}")
    from proxy.logs import configure_logging

    log_config = configure_logging(settings.server.log_level)  # before vLLM is imported

    from engine.args import SettingsError, uvicorn_options
    from proxy.app import create_app

    try:
        app = create_app(settings)
    except SettingsError as exc:
        sys.exit(f"phasespec: {exc}")
    drain = app.state.drain
    tls_and_logs, h11_limits = uvicorn_options(app.state.vllm_args)
    config = uvicorn.Config(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level=settings.server.log_level,
        log_config=log_config,
        # The middleware cuts what is left at the grace period; this is a backstop.
        timeout_graceful_shutdown=int(drain.grace_s) + 5,
        **tls_and_logs,
    )
    for name, value in h11_limits.items():
        setattr(config, name, value)
    server = DrainingServer(config)
    server.on_exit = drain.request
    app.state.request_exit = lambda: setattr(server, "should_exit", True)
    # uvicorn re-raises the signal it stopped on once it is done; a drained
    # SIGTERM is a clean stop, so it ends the process with status 0, not 143.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    server.run()
    if app.state.engine_died:
        sys.exit(1)  # a supervisor restarts a process that failed


class DrainingServer(uvicorn.Server):
    """uvicorn, draining in-flight requests on SIGTERM/SIGINT (proxy/drain.py)."""

    on_exit = staticmethod(lambda: None)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    main()
