"""The store's read side: runs loaded back as `Run` values, the newest-runs listing, thread states to
resume from, similar-run snapshots, exact model requests, and the read-only SQL people type."""
