"""Benchmarks behind ``evq bench``: measurement code only.

Each benchmark returns a result object; rendering it (table, JSON) and printing is the CLI's
business (:mod:`evq.cli`).
"""
