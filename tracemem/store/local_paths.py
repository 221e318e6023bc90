"""Store files and export folders are on this machine, and DuckDB never fetches an extension for tracemem.

Why: DuckDB opens `md:name` (MotherDuck), `s3://…` or `https://…` by loading an extension, and
downloads and installs one that is missing; pyarrow writes `s3://…` through its S3 filesystem.
tracemem downloads nothing at run time, and a store or an export that silently went elsewhere would
surprise. So a name with a URL scheme (two letters or more before the colon: a Windows drive letter is
a path) is refused before anything opens it, saying what to do, and every DuckDB connection tracemem
opens on a file has extension autoload and autoinstall turned off (`no_downloads`). Those two settings
belong to the file's database instance, which the Store opened: a query on it that needs an
extension then fails with DuckDB's "install it first" instead of reaching the network, while other
DuckDB databases of the process keep their own settings.
"""
from __future__ import annotations

import re
from typing import Any

from ..errors import TracememError

__all__ = ["check_local", "no_downloads"]

REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def check_local(path: str, what: str) -> None:
    """Refuse `path` (a store file or an export folder: `what`) when it names something on the network."""
    if path != ":memory:" and REMOTE.match(path):
        raise TracememError(f"{what} {path!r} is not on this machine: tracemem keeps a store in a local DuckDB file "
                            f"or a postgresql:// database, and writes exports to a local folder (DuckDB would "
                            f"download an extension to reach it); give a path here, and copy files elsewhere with "
                            f"your own tools")


def no_downloads(con: Any) -> None:
    """Turn extension autoload and autoinstall off on the database `con` is a connection of."""
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
