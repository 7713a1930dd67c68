"""Master/slave replication of the log."""
