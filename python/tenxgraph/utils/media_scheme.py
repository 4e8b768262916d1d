"""The URI scheme of media stored by the framework: ``graph://media/<key>``, and 10xGraph's
legacy ``agentflow://media/<key>``, which every reader still accepts so older data resolves."""

from __future__ import annotations

__all__ = ["LEGACY_MEDIA_SCHEME", "MEDIA_SCHEME", "MEDIA_SCHEMES", "is_internal_media_url", "strip_media_scheme"]

MEDIA_SCHEME = "graph://media/"
LEGACY_MEDIA_SCHEME = "agentflow://media/"
MEDIA_SCHEMES: tuple[str, ...] = (MEDIA_SCHEME, LEGACY_MEDIA_SCHEME)


def is_internal_media_url(url: str | None) -> bool:
    """True when ``url`` starts with the current or the legacy media scheme; False for None or ""."""
    return bool(url) and url.startswith(MEDIA_SCHEMES)  # type: ignore[union-attr]


def strip_media_scheme(url: str) -> str:
    """The storage key of an internal media URL (either scheme); any other string unchanged."""
    for scheme in MEDIA_SCHEMES:
        if url.startswith(scheme):
            return url[len(scheme):]
    return url
