"""Structured logging: structlog in front of the standard library, console or JSON lines."""

import logging
import logging.config

import structlog


def configure(*, level: str = "INFO", fmt: str = "console") -> None:
    shared = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer = structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    logging.config.dictConfig(
        {
            "version": 1,
            "disable_existing_loggers": False,
            "formatters": {
                "structured": {
                    "()": structlog.stdlib.ProcessorFormatter,
                    "processors": [structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
                    "foreign_pre_chain": shared,
                }
            },
            "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "structured"}},
            "root": {"handlers": ["console"], "level": level},
            "loggers": {
                "django.db.backends": {"level": "WARNING"},
                "celery": {"level": level},
            },
        }
    )
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
