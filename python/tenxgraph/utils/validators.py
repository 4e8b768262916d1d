"""Input validators with 10xGraph 0.10's API: prompt-injection screening and message structure.

Register them on a :class:`~tenxgraph.utils.callbacks.CallbackManager` (or call
:func:`register_default_validators`); the graph runs them on a run's input messages before
anything is merged or persisted, so a refused input leaves the thread as it was.

The detection rules are tenxgraph's own (docs/migrating-from-10xgraph.md, "utils.validators",
lists them with the reasoning and where they differ from 10xGraph's). They are heuristics: a
screen for the obvious attempts, not a guarantee. The ``violation_type`` names are 10xGraph's, so
code that branches on them works unchanged.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
import unicodedata
from typing import Any

from tenxgraph.core.state.message import Message
from tenxgraph.utils.callbacks import BaseValidator

__all__ = [
    "MessageContentValidator",
    "PromptInjectionValidator",
    "ValidationError",
    "register_default_validators",
]

logger = logging.getLogger("tenxgraph.utils")

# One stable code for every refusal; `violation_type` says which rule refused.
VALIDATION_ERROR_CODE = "VALIDATION_001"


class ValidationError(Exception):
    """An input validator refused the run's input messages.

    ``str(err)`` is the message (as in 10xGraph); ``violation_type`` names the rule
    (``length_exceeded``, ``injection_pattern``, ``encoding_attack``, ``suspicious_keywords``,
    ``payload_splitting``, ``invalid_role``, ``too_many_blocks``) and ``details`` what matched.
    """

    error_code: str = VALIDATION_ERROR_CODE

    def __init__(self, message: str, violation_type: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.violation_type = violation_type
        self.details: dict[str, Any] = details if details is not None else {}

    def to_dict(self) -> dict[str, Any]:
        """``{"error_type", "error_code" (VALIDATION_001), "message", "violation_type", "details"}``."""
        return {
            "error_type": type(self).__name__,
            "error_code": self.error_code,
            "message": self.message,
            "violation_type": self.violation_type,
            "details": self.details,
        }


# A few words may sit between the verb and its object ("ignore all of the previous
# instructions"), but a bounded gap, not `.*`, so two distant sentences do not combine.
_GAP = r"(?:[\s,]+[\w'-]+){0,4}?[\s,]+"
_PRIOR = r"(?:previous|prior|earlier|preceding|above|all|any|your|the\s+system)"
_ORDERS = r"(?:instructions?|prompts?|rules|directions?|guidelines|commands?|orders|constraints)"

# (rule name, pattern). Each names one way an input tries to take the instructions' place.
_INJECTION_RULES: list[tuple[str, str]] = [
    # Telling the model to drop what it was told.
    ("instruction_override",
     rf"\b(?:ignore|disregard|forget|override|discard|abandon|skip)\b{_GAP}?{_PRIOR}{_GAP}?{_ORDERS}\b"),
    ("instruction_override",
     rf"\b(?:ignore|disregard|forget)\s+(?:everything|all)\s+(?:you\s+(?:were|have\s+been)\s+told|above|before)"),
    # Giving the model a new identity or turning its limits off.
    ("role_reassignment", r"\byou\s+are\s+(?:now|no\s+longer)\s+\w+"),
    ("role_reassignment", r"\bfrom\s+now\s+on,?\s+you\s+(?:are|will|must|shall)\b"),
    ("role_reassignment", r"\b(?:pretend|roleplay|role-play)\s+(?:to\s+be|that\s+you|you\s+are|as)\b"),
    ("role_reassignment", r"\b(?:act|behave|respond)\s+as\s+(?:if\s+you\s+(?:have|had)\s+no|an?\s+(?:unrestricted|unfiltered|uncensored))"),
    ("role_reassignment", r"\bnew\s+(?:persona|identity|role|character)\b"),
    # Asking for the hidden instructions.
    ("prompt_extraction",
     r"\b(?:reveal|show|print|output|display|repeat|leak|dump|tell\s+me)\b"
     r"(?:\s+\w+){0,3}?\s+(?:system\s+prompt|(?:hidden|initial|original|system|secret)\s+(?:instructions?|prompt))"),
    ("prompt_extraction", r"\bwhat\s+(?:is|are|was|were)\s+your\s+(?:system\s+prompt|(?:initial|original|hidden)\s+instructions?)"),
    # Markers that pretend the trusted part ended, or that a new speaker begins.
    ("fake_delimiter", r"(?:^|\n)\s*[-=*#~_]{3,}\s*(?:end|begin|start)\s+(?:of\s+)?(?:the\s+)?(?:system\s+)?(?:instructions?|prompt|context)\b"),
    ("fake_delimiter", r"<\|\s*(?:im_start|im_end|system|endoftext)\s*\|>|\[/?INST\]|<</?SYS>>"),
    ("fake_delimiter", r"<\s*/?\s*(?:system|instructions?|prompt)\s*>"),
    ("fake_delimiter", r"(?:^|\n)\s*(?:#{1,3}\s*)?system\s*(?:prompt)?\s*:\s*\S"),
    # Named jailbreak modes.
    ("jailbreak_mode", r"\b(?:DAN|developer|god|admin|debug|unrestricted)\s+mode\b"),
    ("jailbreak_mode", r"\bdo\s+anything\s+now\b"),
    ("jailbreak_mode", r"\bjailbr(?:eak|oken)\b"),
    # Template expressions, which a prompt renderer downstream might evaluate.
    ("template_expression", r"\{\{.*?\}\}|\{%.*?%\}|\$\{[^}\n]*\}"),
    # Claims of authority over the model.
    ("authority_claim", r"\bi\s*(?:am|'m)\s+(?:your|the)\s+(?:developer|creator|admin(?:istrator)?|owner|operator)\b"),
    ("authority_claim", r"\b(?:this\s+is\s+an?\s+)?(?:message|order|instruction)\s+from\s+(?:your|the)\s+(?:developers?|admin(?:istrator)?s?|system)\b"),
    # Commands to run something.
    ("command_execution", r"\b(?:execute|run|eval)\s+(?:the\s+following|this)\s+(?:command|code|script|shell)\b"),
    ("command_execution", r"(?:^|\s)sudo\s+\w+"),
]

_COMPILED_RULES = [(name, re.compile(pattern, re.IGNORECASE)) for name, pattern in _INJECTION_RULES]

# Words attackers lean on; one alone is ordinary English, several together are a signal.
_SUSPICIOUS_TERMS = [
    "ignore", "disregard", "bypass", "jailbreak", "override", "unrestricted", "uncensored",
    "no restrictions", "no rules", "system prompt", "hidden instructions", "developer mode",
    "reveal", "inject", "payload", "exploit",
]
_KEYWORD_THRESHOLD = 3

_SPLITTING_RULES = [
    re.compile(r"\bpart\s+\d+\s+(?:of|/)\s+\d+\b", re.IGNORECASE),
    re.compile(r"\[\s*(?:split|chunk|part)\s*\d+\s*/\s*\d+\s*\]", re.IGNORECASE),
    re.compile(r"\b(?:continued|continuing)\s+from\s+(?:my|the)\s+(?:previous|last|earlier)\s+(?:message|part|input)\b", re.IGNORECASE),
    re.compile(r"\b(?:combine|concatenate|join)\s+(?:it\s+)?with\s+(?:my|the)\s+(?:previous|last|earlier)\s+(?:message|part|input)\b", re.IGNORECASE),
]

_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{24,}={0,2}")
_ESCAPE_RUN = re.compile(r"(?:\\x[0-9a-fA-F]{2}|\\u[0-9a-fA-F]{4}|%[0-9a-fA-F]{2}){8,}")
# A run of punctuation mixing many different symbols: the shape of optimiser-found suffixes.
# Repeats of one symbol ("-----", "!!!!", "...") are ordinary formatting and pass.
_SYMBOL_RUN = re.compile(r"[^\w\s]{10,}")
_SYMBOL_DISTINCT = 5


# Format characters that ordinary text needs: the soft hyphen, and the zero-width (non-)joiner
# that emoji sequences and Persian or Indic scripts use.
_ORDINARY_FORMAT = frozenset("\u00ad\u200c\u200d")


def _invisible_controls(text: str) -> int:
    """Zero-width and bidirectional-override characters hide words from a reader (and a regex)."""
    # A leading byte-order mark is what some editors put at the start of pasted text.
    body = text[1:] if text.startswith("\ufeff") else text
    return sum(1 for ch in body if unicodedata.category(ch) == "Cf" and ch not in _ORDINARY_FORMAT)


class PromptInjectionValidator(BaseValidator):
    """Refuses input that tries to replace the agent's instructions (OWASP LLM01).

    ``strict_mode=True`` raises :class:`ValidationError` on the first violation; ``False`` logs
    each violation as a warning and lets the input through unchanged. ``blocked_patterns`` are
    extra regular expressions (matched case-insensitively) that refuse as ``injection_pattern``;
    ``suspicious_keywords`` are extra terms for the keyword-density rule.
    """

    def __init__(
        self,
        strict_mode: bool = True,
        max_length: int = 10000,
        blocked_patterns: list[str] | None = None,
        suspicious_keywords: list[str] | None = None,
    ) -> None:
        self.strict_mode = strict_mode
        self.max_length = max_length
        self.blocked_patterns = list(blocked_patterns or [])
        self.suspicious_keywords = list(suspicious_keywords or [])
        # Compiled here so a bad user pattern fails at construction, not mid-run.
        try:
            self._extra = [re.compile(p, re.IGNORECASE) for p in self.blocked_patterns]
        except re.error as exc:
            raise ValueError(f"blocked_patterns holds an invalid regular expression: {exc}") from exc
        self._terms = [t.lower() for t in (*_SUSPICIOUS_TERMS, *self.suspicious_keywords)]

    async def validate(self, messages: list[Message]) -> bool:
        for msg in messages:
            if not isinstance(msg, Message):
                continue
            text = msg.text()
            if text:
                self._check(text)
        return True

    def _check(self, text: str) -> None:
        if len(text) > self.max_length:
            self._violation(
                f"Input exceeds maximum length of {self.max_length} characters",
                "length_exceeded",
                {"length": len(text), "max_length": self.max_length},
            )
        for rule, pattern in _COMPILED_RULES:
            found = pattern.search(text)
            if found:
                self._violation(
                    "Potential prompt injection detected: pattern matched",
                    "injection_pattern",
                    {"rule": rule, "pattern": pattern.pattern, "matched": found.group(0)[:200]},
                )
        for pattern in self._extra:
            found = pattern.search(text)
            if found:
                self._violation(
                    "Potential prompt injection detected: pattern matched",
                    "injection_pattern",
                    {"rule": "blocked_pattern", "pattern": pattern.pattern, "matched": found.group(0)[:200]},
                )
        self._check_encodings(text)
        self._check_symbol_runs(text)
        self._check_keywords(text)
        self._check_splitting(text)

    def _check_encodings(self, text: str) -> None:
        for run in _BASE64_RUN.findall(text):
            decoded = self._decode_base64(run)
            if decoded and self._looks_like_injection(decoded):
                self._violation(
                    "Suspicious base64 encoded content detected",
                    "encoding_attack",
                    {"encoding": "base64", "encoded": run[:50], "decoded_sample": decoded[:100]},
                )
        found = _ESCAPE_RUN.search(text)
        if found:
            self._violation(
                "Escaped byte sequence detected (possible obfuscation)",
                "encoding_attack",
                {"encoding": "escapes", "matched": found.group(0)[:100]},
            )
        hidden = _invisible_controls(text)
        if hidden:
            self._violation(
                "Invisible formatting characters detected (possible obfuscation)",
                "encoding_attack",
                {"encoding": "invisible_characters", "count": hidden},
            )

    @staticmethod
    def _decode_base64(run: str) -> str | None:
        padded = run + "=" * (-len(run) % 4)
        try:
            raw = base64.b64decode(padded, validate=True)
        except (binascii.Error, ValueError):
            return None
        decoded = raw.decode("utf-8", errors="replace")
        # Random-looking runs (hashes, ids) decode to binary noise: only readable text counts.
        printable = sum(ch.isprintable() or ch.isspace() for ch in decoded)
        return decoded if decoded and printable >= 0.9 * len(decoded) else None

    def _looks_like_injection(self, decoded: str) -> bool:
        if any(pattern.search(decoded) for _, pattern in _COMPILED_RULES):
            return True
        low = decoded.lower()
        return any(term in low for term in self._terms)

    def _check_symbol_runs(self, text: str) -> None:
        for run in _SYMBOL_RUN.findall(text):
            if len(set(run)) >= _SYMBOL_DISTINCT:
                self._violation(
                    "Adversarial character sequence detected",
                    "injection_pattern",
                    {"rule": "adversarial_suffix", "matched": run[:100]},
                )
                return

    def _check_keywords(self, text: str) -> None:
        low = text.lower()
        matched = [term for term in dict.fromkeys(self._terms) if term in low]
        if len(matched) >= _KEYWORD_THRESHOLD:
            self._violation(
                f"Multiple suspicious keywords detected ({len(matched)})",
                "suspicious_keywords",
                {"keywords": matched, "count": len(matched)},
            )

    def _check_splitting(self, text: str) -> None:
        for pattern in _SPLITTING_RULES:
            found = pattern.search(text)
            if found:
                self._violation(
                    "Potential payload splitting detected",
                    "payload_splitting",
                    {"pattern": pattern.pattern, "matched": found.group(0)[:200]},
                )
                return

    def _violation(self, message: str, violation_type: str, details: dict[str, Any]) -> None:
        logger.warning("Validation violation: %s - %s", violation_type, message)
        if self.strict_mode:
            raise ValidationError(message, violation_type, details)


class MessageContentValidator(BaseValidator):
    """Refuses messages whose role is not in ``allowed_roles`` or that carry more than
    ``max_content_blocks`` content blocks. It always raises (it has no lenient mode)."""

    def __init__(self, allowed_roles: list[str] | None = None, max_content_blocks: int = 50) -> None:
        self.allowed_roles = list(allowed_roles or ["user", "assistant", "system", "tool"])
        self.max_content_blocks = max_content_blocks

    async def validate(self, messages: list[Message]) -> bool:
        for msg in messages:
            if not isinstance(msg, Message):
                continue
            if msg.role not in self.allowed_roles:
                raise ValidationError(
                    f"Invalid message role: {msg.role}",
                    "invalid_role",
                    {"role": msg.role, "allowed": self.allowed_roles},
                )
            if isinstance(msg.content, list) and len(msg.content) > self.max_content_blocks:
                raise ValidationError(
                    f"Too many content blocks: {len(msg.content)}",
                    "too_many_blocks",
                    {"count": len(msg.content), "max": self.max_content_blocks},
                )
        return True


def register_default_validators(callback_manager: Any, strict_mode: bool = True) -> None:
    """Registers a :class:`PromptInjectionValidator` (with ``strict_mode``), then a
    :class:`MessageContentValidator`, on ``callback_manager``."""
    callback_manager.register_input_validator(PromptInjectionValidator(strict_mode=strict_mode))
    callback_manager.register_input_validator(MessageContentValidator())
    logger.info("Registered default validators (strict_mode=%s)", strict_mode)
