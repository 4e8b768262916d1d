"""The CLI's redaction: the rules live in :mod:`tenxgraph.utils.redact`, which the logging
filter (``mask_secrets``) uses too."""

from tenxgraph.utils.redact import MASK, RedactingStream, redact

__all__ = ["MASK", "RedactingStream", "redact"]
