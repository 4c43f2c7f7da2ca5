"""Reading a YAML config file with typed errors: one place for every config of the project."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from orchestrator.core.errors import ConfigError


def read_yaml(path: str | Path, field: str = "config") -> Any:
    """The parsed YAML at ``path`` (None for an empty file).

    Raises :class:`ConfigError` naming ``field`` (the option or key that gave
    the path) for a missing/unreadable file or invalid YAML, with the first
    line of the parser's message.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(field, str(p), "a readable YAML file", detail=e.strerror or str(e)) from None
    except UnicodeDecodeError as e:
        raise ConfigError(field, str(p), "a YAML file in UTF-8", detail=f"byte {e.start} is not UTF-8") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(field, str(p), "valid YAML", detail=str(e).splitlines()[0]) from None
