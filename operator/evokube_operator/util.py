"""Small helpers shared by the builders, placement, the policies and the Kopf handlers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def plain(value: Any) -> Any:
    """A deep copy in plain dicts and lists (YAML- and JSON-safe, free of Kopf's views)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


# The longest message of a condition or an Event the operator writes from someone else's words
# (an API server's, a kubelet's, a scheduler's).
MESSAGE_LIMIT = 512


def clip(message: str, limit: int = MESSAGE_LIMIT) -> str:
    return message if len(message) <= limit else message[: limit - 3] + "..."
