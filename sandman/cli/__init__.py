"""The `sandman` command line (also installed as the kubectl plugin)."""
