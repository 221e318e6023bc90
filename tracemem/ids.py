"""Random ids: 64 random bits from the operating system as 16 hex characters.

`os.urandom` costs well under a microsecond here and is safe in forked children (no
generator state to reseed), so there is nothing to keep per process."""
from __future__ import annotations

import os


def new_id(bits: int = 64) -> str:
    """`bits` random bits as lowercase hex (16 characters for the default 64)."""
    return os.urandom(bits // 8).hex()
