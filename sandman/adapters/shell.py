"""Shell text shared by the adapters (pure)."""

from __future__ import annotations


def merged(command: str) -> str:
    """``command`` with stderr merged into stdout, in order, in the session's own shell.

    A group, not a subshell: ``cd`` and ``export`` still persist. The newline
    before ``}`` ends a trailing comment or heredoc terminator.
    """
    return "{ " + command + "\n} 2>&1"
