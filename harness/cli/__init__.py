"""CLI commands of the harness: `sandman cluster`, `sandman image`, `sandman demo`."""
