"""Settings: one root object, built in the app factory (never at import time)."""

from config.settings import EngineSettings, PhaseSettings, ServerSettings, Settings

__all__ = ["EngineSettings", "PhaseSettings", "ServerSettings", "Settings"]
