from tests.client.conftest import Served, cluster, pytest_pyfunc_call, served

__all__ = ["Served", "cluster", "pytest_pyfunc_call", "served"]
