"""Sandman's Kubernetes manifests, shipped as package data (``sandman install``)."""
