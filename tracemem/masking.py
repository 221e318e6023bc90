"""Keeping known secrets out of everything a run records.

A run's known secrets are the values of its scope's secret fields (`SecretStr`,
`SecretBytes`, or `Field(json_schema_extra={"secret": True})`) and the credentials of
the models it called through `ctx.complete` (their `api_key`, and a password in their
`base_url`). The runner masks every text a finished step hands its sinks — the step's
error and logs, its rows (`model_calls.error` and `.response`, `prompts`,
`prompt_sections`, ...), the values it wrote — and the run's error and output, so
neither the DuckDB file, its journal, a Parquet export, the CLI nor OpenTelemetry
ever holds them. A secret of `MIN_LENGTH` characters or more is masked wherever it
appears; a shorter one (a 3-digit PIN) only where it stands as a word of its own, since
masking "a" inside every word would destroy the text while protecting nothing.

Secret fields themselves are stored as an HMAC (`{"$redacted": "hmac-sha256:…"}`), so
equal secrets can still be told equal. The HMAC key is never in the store: it is
derived from a key kept outside it, `TRACEMEM_SECRET_KEY` when that environment variable
is set, else a random key in a file beside the user's configuration
(`$TRACEMEM_CONFIG_DIR`, else `$XDG_CONFIG_HOME/tracemem`, else `~/.config/tracemem`:
`secret-key`, made on the first secret hashed, readable by its owner only), mixed with
the store's own random salt so two stores hash alike secrets differently. Someone
holding only the store file cannot test guesses against a hash; a 4-digit PIN is as
safe as the key. Machines writing one PostgreSQL store must share the key (the same
`TRACEMEM_SECRET_KEY`, or a copy of the key file) for equal secrets to hash equal.
Hashes a store holds from before the key moved out (keyed by its salt alone) stay as
they are; new ones do not equal them.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import threading
import urllib.parse
from typing import Any, Collection, Iterable, Mapping, Optional

from .errors import TracememError
from .record import Decision, Step, Write

__all__ = ["CONFIG_DIR_ENV", "SECRET_KEY_ENV", "MASK", "MIN_LENGTH", "HashKey", "credentials", "key_file",
           "Masker", "run_masker", "mask_step"]

SECRET_KEY_ENV = "TRACEMEM_SECRET_KEY"
CONFIG_DIR_ENV = "TRACEMEM_CONFIG_DIR"
MASK = "<redacted>"
MIN_LENGTH = 4


def key_file() -> str:
    """Where the hash key lives when `TRACEMEM_SECRET_KEY` is not set (see the module docstring)."""
    folder = os.environ.get(CONFIG_DIR_ENV) or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config"), "tracemem")
    return os.path.join(folder, "secret-key")


def _outside_key() -> bytes:
    """The key kept outside every store: the environment's, else the key file's (made on first use)."""
    given = os.environ.get(SECRET_KEY_ENV)
    if given:
        return given.encode()
    path = key_file()
    try:
        with open(path, "rb") as f:
            key = f.read().strip()
        if key:
            return key
    except FileNotFoundError:
        pass
    except OSError as err:
        raise TracememError(f"cannot read the secret hash key {path} ({err.strerror}); make it readable, or set "
                            f"{SECRET_KEY_ENV}") from None
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: theirs counts
        return _outside_key()
    except OSError as err:
        raise TracememError(f"cannot create the secret hash key {path} ({err.strerror}); set {SECRET_KEY_ENV} "
                            f"(or {CONFIG_DIR_ENV} to a writable folder) so secret fields can be hashed") from None
    key = os.urandom(32).hex().encode()
    with os.fdopen(fd, "wb") as f:
        f.write(key + b"\n")
    return key


class HashKey:
    """The HMAC key of one store's secret hashes: the key kept outside the store mixed with the store's salt,
    read (or made) when the first secret is hashed, so a store never used with secrets touches no file."""

    def __init__(self, salt: bytes) -> None:
        self.salt = salt
        self._key: Optional[bytes] = None
        self._lock = threading.Lock()

    def key(self) -> bytes:
        with self._lock:
            if self._key is None:
                self._key = hmac.new(_outside_key(), b"tracemem-secret-hash\0" + self.salt, hashlib.sha256).digest()
            return self._key

    def hexdigest(self, raw: bytes) -> str:
        return hmac.new(self.key(), raw, hashlib.sha256).hexdigest()


def _raw(value: Any) -> Optional[str]:
    raw = value.get_secret_value() if hasattr(value, "get_secret_value") else value
    if isinstance(raw, bytes):
        raw = raw.decode(errors="ignore")
    return raw if isinstance(raw, str) and raw else None


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
        if password:
            found.extend({password, urllib.parse.unquote(password)})
    return found


class Masker:
    """Replaces known secret values (and their JSON-escaped spellings) with `<redacted>` in text and values:
    long ones wherever they appear, short ones where they stand as a word (see the module docstring)."""

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
        self.texts = sorted((t for t in texts if len(t) >= MIN_LENGTH), key=len, reverse=True)  # longest first
        short = sorted((t for t in texts if len(t) < MIN_LENGTH), key=len, reverse=True)
        self.words = re.compile("|".join(rf"(?<!\w){re.escape(t)}(?!\w)" for t in short)) if short else None

    def __bool__(self) -> bool:
        return bool(self.texts) or self.words is not None

    def text(self, text: Any) -> Any:
        if not self or not text or not isinstance(text, str):
            return text
        for secret in self.texts:
            if secret in text:
                text = text.replace(secret, MASK)
        if self.words is not None:
            text = self.words.sub(MASK, text)
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


def mask_step(masker: Masker, step: Step, writes: list[Write], rows: list[tuple[str, dict[str, Any]]],
              decision: Optional[Decision]) -> tuple[Step, list[Write], list[tuple[str, dict[str, Any]]],
                                                      Optional[Decision]]:
    """A finished step with known secrets masked in everything it records (its error, logs, written values,
    rows and decision evidence)."""
    if not masker:
        return step, writes, rows, decision
    step = step._replace(error=masker.text(step.error), logs=masker.value(step.logs))
    writes = [w._replace(value=masker.text(w.value)) for w in writes]
    rows = [(table, masker.value(row)) for table, row in rows]
    if decision is not None:
        decision = decision._replace(evidence=masker.value(decision.evidence))
    return step, writes, rows, decision
