"""Sandman: Kubernetes-native sandboxes for agentic RL and agent evaluation."""

from __future__ import annotations

__version__ = "0.1.0"
