"""The method registry: one name -> one drafter class.

The CLI, the Python API, the benchmark and the server all look methods up here, so a method registered once
is reachable everywhere. Drafter modules register themselves on import (``paradecode.drafters`` imports them
all).
"""

from __future__ import annotations

from typing import Any, Callable

from paradecode.errors import ParadecodeError

_METHODS: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    def wrap(cls: type) -> type:
        if name in _METHODS and _METHODS[name] is not cls:
            raise ValueError(f"method {name!r} is registered twice")
        _METHODS[name] = cls
        cls.method_name = name
        return cls

    return wrap


def method_names() -> list[str]:
    import paradecode.drafters  # noqa: F401  (registers the built-in methods)

    return sorted(_METHODS)


def get_method(name: str) -> type:
    names = method_names()
    if name not in _METHODS:
        raise ParadecodeError(f"unknown method {name!r}; choose one of: {', '.join(names)}.")
    return _METHODS[name]


def parse_options(pairs: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Turn ``["k=v", ...]`` (CLI ``--opt``) into a dict, reading ints, floats and booleans."""
    options: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key.strip():
            raise ParadecodeError(f"method options take the form key=value, got {pair!r}.")
        options[key.strip().replace("-", "_")] = _parse_value(raw.strip())
    return options


def _parse_value(raw: str) -> Any:
    lowered = raw.lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    for cast in (int, float):
        try:
            return cast(raw)
        except ValueError:
            pass
    return raw
