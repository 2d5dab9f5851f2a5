"""Mutating/validating admission webhook: daemon injection and sandbox policy."""
