"""Reclaims sandboxes past their lease, idle, or stuck."""
