from tests.client.conftest import Served, cluster, pytest_pyfunc_call

__all__ = ["Served", "cluster", "pytest_pyfunc_call"]
