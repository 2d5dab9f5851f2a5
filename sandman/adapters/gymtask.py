"""Tasks, actions and observations of the Gymnasium adapter (pure: no sandbox, no gymnasium).

A coding task is what an episode starts from: a prompt, files and setup
commands that put the sandbox into the task's state, and a check whose exit
code decides the default reward when the agent submits.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandman.client import Sandbox

# Printable ASCII plus newline and tab: what a shell command or a terminal
# transcript needs. A charset of all of Unicode (1.1M characters) takes
# seconds to build in gymnasium's Text space; other characters are escaped.
CHARSET = "".join(chr(c) for c in range(0x20, 0x7F)) + "\n\t"
_CHARSET = frozenset(CHARSET)
# The session daemon (as of this writing) names its per-run script in bash's
# own error messages (".../run/session-<random>/run-<n>.sh: line 1: ..."): a
# random id and a counter that would make seeded replays differ, and a path
# the agent has no business seeing. Shown as "bash" instead.
_SESSION_SCRIPT = re.compile(r"\S*/run/session-[0-9a-f]+/run-\d+\.sh")
SUBMIT = "submit"


@dataclass(frozen=True)
class FileEdit:
    """An action that writes a whole file (instead of a shell command)."""

    path: str
    content: str


Action = str | FileEdit


@dataclass(frozen=True)
class Task:
    """One coding task: the prompt is the first observation of its episodes."""

    id: str
    prompt: str
    files: Mapping[str, str] = field(default_factory=dict)  # written at every reset
    setup: Sequence[str] = ()  # shell commands run at every reset; each must exit 0
    check: str | None = None  # shell command; exit 0 on submit = solved (reward 1.0)
    cwd: str | None = None  # where the agent's shell starts
    max_steps: int = 30  # the episode is truncated after this many steps

    def __post_init__(self) -> None:
        if self.max_steps < 2:
            raise ValueError("max_steps must be at least 2")


@dataclass(frozen=True)
class StepContext:
    """What a reward function sees after each step."""

    sandbox: Sandbox
    task: Task
    step: int
    action: Action
    exit_code: int | None  # None for a file edit and for submit
    output: str
    submitted: bool


RewardFn = Callable[[StepContext], Awaitable[float]]


def observation(text: str, max_chars: int) -> str:
    """``text`` inside the observation space: charset-safe, at most ``max_chars`` long.

    The end of long output is kept (test summaries and errors come last),
    behind a marker saying how much was cut.
    """
    text = _SESSION_SCRIPT.sub("bash", text)
    if not _CHARSET.issuperset(text):
        text = text.encode("ascii", "backslashreplace").decode("ascii")
        text = "".join(c if c in _CHARSET else "?" for c in text)
    if len(text) <= max_chars:
        return text
    marker = f"[... {len(text) - max_chars} characters cut ...]\n"
    keep = max(0, max_chars - len(marker))
    return (marker + text[len(text) - keep :])[:max_chars]


def step_text(output: str, exit_code: int, timed_out: bool, timeout_s: float) -> str:
    """A command's transcript as the agent sees it."""
    if timed_out:
        return f"{output}[timed out after {timeout_s:g}s; the command was killed]\n"
    if exit_code != 0:
        return f"{output}[exit code {exit_code}]\n"
    return output


def is_submit(action: Action) -> bool:
    return isinstance(action, str) and action.strip() == SUBMIT
