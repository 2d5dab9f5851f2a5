"""An E2B-compatible HTTP gateway in front of Sandman sandboxes (docs/adapters.md)."""
