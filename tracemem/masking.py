"""Keeping known secrets out of everything a run records.

A run's known secrets are the values of its scope's secret fields (`SecretStr`,
`SecretBytes`, or `Field(json_schema_extra={"secret": True})`) and the credentials of
the models it called through `ctx.complete` (their `api_key`, and a password in their
`base_url`). The runner masks every text a finished step hands its sinks — the step's
error and logs, its rows (`model_calls.error` and `.response`, `prompts`,
`prompt_sections`, ...), the values it wrote — and the run's error and output, so
neither the DuckDB file, its journal, a Parquet export, the CLI nor OpenTelemetry
ever holds them. Values shorter than `MIN_LENGTH` are not masked (masking "a" would
destroy every text while protecting nothing).

Secret fields themselves are stored as an HMAC (`{"$redacted": "hmac-sha256:…"}`), so
equal secrets can still be told equal. The HMAC key is the file's random salt, or,
when the environment variable `TRACEMEM_SECRET_KEY` is set, a key derived from it
and the salt: then someone holding only the file cannot test guesses. Without it,
the salt sits in the same file as the hashes, and a hash protects only a
high-entropy secret (an API key, a random token): a 4-digit PIN or a password from
a word list can be recovered by trying every candidate.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import urllib.parse
from typing import Any, Collection, Iterable, Mapping, Optional

from .record import Decision, StepFields, WriteFields

__all__ = ["SECRET_KEY_ENV", "MASK", "MIN_LENGTH", "hash_key", "credentials", "Masker", "run_masker", "mask_step"]

SECRET_KEY_ENV = "TRACEMEM_SECRET_KEY"
MASK = "<redacted>"
MIN_LENGTH = 4


def hash_key(file_salt: bytes) -> bytes:
    """The key secret fields are hashed with: the file's salt, mixed with `TRACEMEM_SECRET_KEY` when set."""
    key = os.environ.get(SECRET_KEY_ENV)
    if not key:
        return file_salt
    return hmac.new(key.encode(), b"tracemem-secret-hash\0" + file_salt, hashlib.sha256).digest()


def _raw(value: Any) -> Optional[str]:
    raw = value.get_secret_value() if hasattr(value, "get_secret_value") else value
    if isinstance(raw, bytes):
        raw = raw.decode(errors="ignore")
    return raw if isinstance(raw, str) and len(raw) >= MIN_LENGTH else None


def credentials(model: Any) -> list[str]:
    """The secrets a chat model carries: its `api_key`, and the password of a `user:password@` base URL."""
    found = []
    key = _raw(getattr(model, "api_key", None))
    if key is not None:
        found.append(key)
    base = getattr(model, "base_url", None)
    if isinstance(base, str) and "@" in base:
        try:
            password = urllib.parse.urlsplit(base).password
        except ValueError:
            password = None
        if password and len(password) >= MIN_LENGTH:
            found.extend({password, urllib.parse.unquote(password)})
    return found


class Masker:
    """Replaces known secret values (and their JSON-escaped spellings) with `<redacted>` in text and values."""

    def __init__(self, values: Iterable[Any]) -> None:
        texts: set[str] = set()
        for value in values:
            raw = _raw(value)
            if raw is None:
                continue
            texts.add(raw)
            escaped = json.dumps(raw)[1:-1]  # how the value appears inside JSON text
            if escaped != raw:
                texts.add(escaped)
        self.texts = sorted(texts, key=len, reverse=True)  # longest first: a secret containing another

    def __bool__(self) -> bool:
        return bool(self.texts)

    def text(self, text: Any) -> Any:
        if not self.texts or not text or not isinstance(text, str):
            return text
        for secret in self.texts:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

    def value(self, value: Any) -> Any:
        """Text inside dicts, lists and tuples masked (a new container only where something changed)."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, dict):
            out = {k: self.value(v) for k, v in value.items()}
            return value if all(out[k] is value[k] for k in value) else out
        if isinstance(value, (list, tuple)):
            items = [self.value(v) for v in value]
            if all(a is b for a, b in zip(items, value)):
                return value
            return type(value)(*items) if hasattr(value, "_fields") else type(value)(items)
        return value


NO_SECRETS = Masker(())


def run_masker(secret_fields: Collection[str], data: Mapping[str, Any], extra: Collection[str],
               overlay: Optional[Mapping[str, Any]] = None) -> Masker:
    """The masker of a run: its secret fields' values (committed, and written by the step in flight) and
    the model credentials it met (empty when there is nothing to mask)."""
    if not secret_fields and not extra:
        return NO_SECRETS
    fields = list(secret_fields)
    values = [data.get(name) for name in fields] + list(extra)
    if overlay:
        values += [overlay[name] for name in fields if name in overlay]
    return Masker(values)


def mask_step(masker: Masker, step: StepFields, writes: list[WriteFields], rows: list[tuple[str, dict[str, Any]]],
              decision: Optional[Decision]) -> tuple[StepFields, list[WriteFields], list[tuple[str, dict[str, Any]]],
                                                      Optional[Decision]]:
    """A finished step with known secrets masked in everything it hands the sinks (its step and writes as the
    runner records them: plain field tuples, run.Records)."""
    if not masker:
        return step, writes, rows, decision
    step = (*step[:6], masker.text(step[6]), *step[7:11], masker.value(step[11]))  # (error, logs: Step fields)
    writes = [(*w[:4], masker.text(w[4])) for w in writes]  # (value)
    rows = [(table, masker.value(row)) for table, row in rows]
    if decision is not None:
        decision = decision._replace(evidence=masker.value(decision.evidence))
    return step, writes, rows, decision
