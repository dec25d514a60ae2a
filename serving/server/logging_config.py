"""The server's one logging configuration (uvicorn runs with ``log_config=None`` so it installs none of its own).

Only entry points (``mtgate serve``, ``create_app``) call :func:`configure_logging`; library modules just use
``logging.getLogger(__name__)``.
"""

from __future__ import annotations

import json
import logging
import logging.config
import time
from typing import Any

from serving.server.settings import ServingSettings

_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts``, ``level``, ``logger``, ``message`` (+ ``exc`` with a traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging(settings: ServingSettings) -> None:
    """Send every logger (ours and uvicorn's) to stderr at ``settings.log_level`` in ``settings.log_format``."""
    formatter: dict[str, Any] = {"()": JsonFormatter} if settings.log_format == "json" else {"format": _TEXT_FORMAT}
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {"default": formatter},
            "handlers": {
                "stderr": {"class": "logging.StreamHandler", "formatter": "default", "stream": "ext://sys.stderr"}
            },
            "root": {"handlers": ["stderr"], "level": settings.log_level},
            "loggers": {
                "uvicorn": {"handlers": [], "propagate": True, "level": settings.log_level},
                "uvicorn.error": {"handlers": [], "propagate": True},
                "uvicorn.access": {
                    "handlers": [],
                    "propagate": True,
                    "level": "INFO" if settings.access_log else "WARNING",
                },
            },
        }
    )
