"""mtgate's benchmarks: run from a checkout of the repository (``python -m benchmarks.<name>``); not in the wheel.

See benchmarks/README.md.
"""
