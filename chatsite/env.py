"""Reading typed settings from the environment, with one clear error per bad variable."""

from __future__ import annotations

import os


class ConfigError(Exception):
    """A configuration variable is missing, malformed or points at a service that is down."""


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in {"1", "true", "yes", "on"}:
        return True
    if value in {"0", "false", "no", "off"}:
        return False
    raise ConfigError(f"{name}: expected a boolean (true/false), got {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {raw!r}") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ConfigError(f"{name}: expected a number, got {raw!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_url(name: str, schemes: tuple[str, ...]) -> str | None:
    """An optional service URL. Unset means "use the embedded default"; set but
    empty or with the wrong scheme is an error naming the variable."""
    if name not in os.environ:
        return None
    raw = os.environ[name].strip()
    if not raw:
        raise ConfigError(f"{name} is set but empty: unset it to use the embedded default, or give a URL")
    scheme = raw.split("://", 1)[0] if "://" in raw else ""
    if scheme not in schemes:
        raise ConfigError(f"{name}: unsupported URL scheme {scheme!r}; expected one of {', '.join(schemes)}")
    return raw
