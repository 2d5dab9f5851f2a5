"""Fleets: run an RL batch (problems x rollouts) on sandboxes, and report on it."""

from __future__ import annotations
