"""``host:port`` addresses as the CLI and the redirects write them (``[v6addr]:port`` for IPv6)."""

from __future__ import annotations

from provisionerd.domain.errors import ConfigError


def parse(text: str) -> tuple[str, int]:
    """``"127.0.0.1:7000"`` -> ``("127.0.0.1", 7000)``; ``"[::1]:0"`` -> ``("::1", 0)``. Port 0 = any free port."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"address must look like HOST:PORT, not {text!r}")
    return host, int(port)


def parse_list(text: str) -> list[tuple[str, int]]:
    """A comma-separated list of addresses (at least one)."""
    items = [part for part in text.split(",") if part.strip()]
    if not items:
        raise ConfigError("at least one HOST:PORT address is needed")
    return [parse(part) for part in items]


def format(host: str, port: int) -> str:  # noqa: A001 - the module's name says what is formatted
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
