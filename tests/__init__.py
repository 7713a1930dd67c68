"""evq's test suite; a package so modules can ``from tests.strategies import ...``."""
