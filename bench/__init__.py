"""Benchmarks, run as `sandman bench NAME [--json FILE]`.

Each benchmark brings up (or reuses, via SANDMAN_TEST_CLUSTER) the local
cluster it needs, prints a table and returns its figures as a dict (the JSON
written with --json, whose keys the docs quote).
"""
