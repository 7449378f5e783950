"""Version strings as the rules compare them."""

from __future__ import annotations

from functools import lru_cache

from packaging.version import InvalidVersion, Version


@lru_cache(maxsize=256)
def parse(text: str) -> Version:
    """Parse a package version; a local tag such as `+cu130` is ignored for comparisons."""
    return Version(text)


def is_valid(text: str) -> bool:
    try:
        parse(text)
    except InvalidVersion:
        return False
    return True


def at_least(version: str | None, minimum: str) -> bool:
    """True when `version` is known and >= `minimum` (pre-releases of `minimum` count as reaching it)."""
    if version is None:
        return False
    return parse(version).release >= parse(minimum).release


def below(version: str | None, limit: str) -> bool:
    """True when `version` is known and < `limit`."""
    return version is not None and not at_least(version, limit)


def minor(version: str) -> str:
    """`0.19.2` -> `0.19`."""
    release = parse(version).release
    return f"{release[0]}.{release[1] if len(release) > 1 else 0}"
