"""``phasespec``: start the server (``--help`` for settings, ``--vllm-help`` for engine flags)."""

from __future__ import annotations

import logging
import signal
import socket
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
    listener = listen(settings.server.host, settings.server.port)
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
    server.run(sockets=[listener])
    if app.state.engine_died:
        sys.exit(1)  # a supervisor restarts a process that failed


def listen(host: str, port: int) -> socket.socket:
    """The server's socket, bound before vLLM is imported or its engine started.

    The engine takes ports of its own while it starts (torch.distributed, data-parallel
    coordination), and the kernel may hand it the one the server was given; bound first, the
    server's port is never taken. A port already in use fails here, in a second, not after the
    engine has loaded. Until the engine is up the socket is bound but not listening, so a client
    is refused as before. (vLLM's own server binds first too.)
    """
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        sys.exit(f"phasespec: cannot listen on {host}:{port}: {exc.strerror or exc}")
    return sock


class DrainingServer(uvicorn.Server):
    """uvicorn, draining in-flight requests on SIGTERM/SIGINT (proxy/drain.py)."""

    on_exit = staticmethod(lambda: None)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        # uvicorn says where it serves only for sockets it bound itself.
        for sock in sockets or []:
            host, port = sock.getsockname()[:2]
            scheme = "https" if self.config.is_ssl else "http"
            message = "Uvicorn running on %s://%s:%d (Press CTRL+C to quit)"
            logging.getLogger("uvicorn.error").info(message, scheme, host, port)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.on_exit()
        super().handle_exit(sig, frame)


if __name__ == "__main__":
    main()
