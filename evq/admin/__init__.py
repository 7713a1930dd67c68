"""Cluster administration: :class:`~evq.admin.operations.Admin` for scripts, ``evq admin``
for people (mqadmin's commands)."""

from evq.admin.operations import Admin, AdminError

__all__ = ["Admin", "AdminError"]
