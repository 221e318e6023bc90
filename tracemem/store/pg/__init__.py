"""PostgreSQL backend (fleet)."""
