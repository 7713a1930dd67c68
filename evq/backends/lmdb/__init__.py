"""LMDB backend of the MessageLog port (see the backends issue)."""
