"""Benchmarks, run as `sandman bench NAME [--json FILE]`.

Each benchmark brings up (or reuses, via SANDMAN_TEST_CLUSTER) the local
cluster it needs, prints a table and returns the JSON keys its issue names.
"""
