"""The PostgreSQL backend (store/backend.py's seam): one database schema that many processes, on many
machines, write at once.

    connection.py   the connection tracemem's own SQL runs on unchanged (`?` parameters, DuckDB names)
    schema.py       the same tables and columns, versioned as store/tables.py; DuckDB-named functions
    copy.py         batches of runs with COPY, one transaction each
    lease.py        liveness without PIDs: a lease per store opening; dead leases' runs recovered
    memory_sql.py   the memory's SQL, and what processes sharing one memory need
    embeddings.py   how a memory's embedding is written and read (pgvector's vector, or real[])
    result.py       what store.sql() returns: a DuckDB relation's methods
    backend.py      the Backend that ties them together
    local.py        a throwaway local server, for tests, benchmarks and trying it out

Everything here imports psycopg (`pip install 'tracemem-agents[postgres]'`); nothing outside this
package imports it, so the core install stays light.
"""
