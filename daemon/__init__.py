"""The in-sandbox daemon (PID 1): authenticated API for commands, files, reset.

Imports nothing from Kubernetes or the other components: it is frozen into
every sandbox and must stay small.
"""

from __future__ import annotations

__version__ = "0.1.0"
