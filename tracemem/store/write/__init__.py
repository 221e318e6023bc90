"""The store's write side: a listener that journals what must survive a crash and queues it, the writer that
puts it into the tables in batches, and recovery of what the journal holds when a store opens."""
