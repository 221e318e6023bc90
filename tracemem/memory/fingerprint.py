"""Fingerprints of the `memories` table, per subject: how a shard file proves it is current.

DuckDB stays the source of truth; a shard file is a cache of one subject's rows.
The fingerprint of a subject is (row count, XOR of DuckDB's `hash()` over every
column the index reads), forgotten rows included. One GROUP BY computes it for
every subject (about 13 ms per 50k rows here); a file whose fingerprint differs
from the table's is stale and is rebuilt, never used. XOR makes it cheap to keep
in step: a change XORs out the row's old hash and XORs in the new one, each
computed by DuckDB on exactly the values written.

Not covered: the embedding column's values (hashing every vector costs ~20x
more). Vectors change only with the text, or through `reembed`, which rebuilds.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import duckdb

__all__ = ["Fingerprint", "ROW_HASH", "by_subject", "of_ids", "of_relation", "combine"]

Fingerprint = tuple[int, int]  # (row count, xor of row hashes)

ROW_HASH = ("hash(memory_id, subject, text, confidence, review_state, valid_from, valid_until, deleted_at, "
            "embedder_id, created_at, updated_at)")


def _rows(con: duckdb.DuckDBPyConnection, source: str, where: str, params: Sequence[object]) -> dict[str, Fingerprint]:
    rows = con.execute(f"SELECT subject, count(*), bit_xor({ROW_HASH}) FROM {source} {where} GROUP BY subject",
                       list(params)).fetchall()
    return {s: (int(n), int(x)) for s, n, x in rows}


def by_subject(con: duckdb.DuckDBPyConnection, subjects: Sequence[str] | None = None) -> dict[str, Fingerprint]:
    """The table's fingerprint of every subject (or of the given ones), from a full scan."""
    if subjects is None:
        return _rows(con, "memories", "", [])
    if not subjects:
        return {}
    return _rows(con, "memories", "WHERE subject IN (SELECT unnest(?::VARCHAR[]))", [list(subjects)])


def of_ids(con: duckdb.DuckDBPyConnection, ids: Sequence[str]) -> dict[str, Fingerprint]:
    """The part of the fingerprint the given rows contribute, as they are now (point lookups)."""
    if not ids:
        return {}
    return _rows(con, "memories", "WHERE memory_id IN (SELECT unnest(?::VARCHAR[]))", [list(ids)])


def of_relation(con: duckdb.DuckDBPyConnection, name: str) -> dict[str, Fingerprint]:
    """The contribution of rows about to be inserted from a registered relation (cast to the table's types)."""
    cast = (f"(SELECT memory_id::VARCHAR AS memory_id, subject::VARCHAR AS subject, text::VARCHAR AS text, "
            f"confidence::DOUBLE AS confidence, review_state::VARCHAR AS review_state, "
            f"valid_from::TIMESTAMP AS valid_from, valid_until::TIMESTAMP AS valid_until, "
            f"deleted_at::TIMESTAMP AS deleted_at, embedder_id::VARCHAR AS embedder_id, "
            f"created_at::TIMESTAMP AS created_at, updated_at::TIMESTAMP AS updated_at FROM {name})")
    return _rows(con, cast, "", [])


def combine(fp: dict[str, Fingerprint], *parts: Iterable[tuple[str, Fingerprint, int]]) -> None:
    """Apply (subject, part, sign) changes in place: sign +1 adds rows, -1 removes them."""
    for part in parts:
        for subject, (n, x), sign in part:
            count, acc = fp.get(subject, (0, 0))
            fp[subject] = (count + sign * n, acc ^ x)
