"""The daemon's configuration: one dataclass, from flags and environment."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sandman.contract import (
    DAEMON_DIR,
    ENV_MANIFESTS,
    ENV_TOKEN_SHA256,
    ENV_TOKEN_SHA256_FILE,
    ENV_WORKSPACE,
    parse_manifests,
)
from sandman.contract import DAEMON_PORT as DEFAULT_PORT


@dataclass(frozen=True)
class Limits:
    """Caps that keep one bad request from hurting the daemon.

    The defaults are sized for coding agents: 16 MiB covers a large source
    file or patch in a JSON body; bigger transfers go through the streamed
    file and tar endpoints, which have their own (much larger) cap.
    """

    max_json_bytes: int = 16 << 20
    max_upload_bytes: int = 8 << 30
    default_output_bytes: int = 1 << 20
    max_output_bytes: int = 64 << 20
    default_timeout_s: float = 600.0
    max_timeout_s: float = 24 * 3600.0
    # Background process output kept for re-reading (ring buffer per process).
    ring_bytes: int = 4 << 20
    max_background: int = 256
    max_sessions: int = 64


@dataclass(frozen=True)
class DaemonConfig:
    host: str = "0.0.0.0"
    port: int = DEFAULT_PORT
    # SHA-256 (hex) of the bearer token; None means every API call is refused
    # (there is no unauthenticated mode).
    token_sha256: str | None = None
    daemon_dir: Path = Path(DAEMON_DIR)
    # Paths the file API may touch; the daemon's own dir is always excluded.
    allowed_roots: tuple[Path, ...] = (Path("/"),)
    workspace: Path | None = None  # the git checkout that /v1/reset restores
    temp_dirs: tuple[Path, ...] = (Path("/tmp"), Path("/var/tmp"))
    # Files and dirs whose content /v1/reset verifies (--manifest, and the
    # pod's sandman.dev/manifests through SANDMAN_MANIFESTS).
    manifest_files: tuple[Path, ...] = ()
    # Python trees /v1/reset verifies; None: the image's, found at start.
    python_dirs: tuple[Path, ...] | None = None
    command: tuple[str, ...] = ()  # the image's own command, supervised
    grace_s: float = 5.0  # SIGTERM -> SIGKILL for children at shutdown
    limits: Limits = field(default_factory=Limits)
    # When the supervised command exits, stop serving and exit with its code
    # (Jobs and other run-to-completion owners, which wait for the pod to end).
    exit_with_command: bool = False
    # /v1/reset is refused (the eval profile: one fresh sandbox per task).
    no_reset: bool = False
    # The target container's own readinessProbe, checked by GET /readyz.
    readiness_probe: Any = None

    @property
    def listen(self) -> str:
        return f"{self.host}:{self.port}"


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise argparse.ArgumentTypeError(f"--listen wants HOST:PORT, got {value!r}")
    return (host.strip("[]") or "0.0.0.0"), int(port)


def read_token_hash(flag_value: str | None, flag_file: str | None) -> str | None:
    """The token hash from --token-sha256(-file) or the environment, validated."""
    value = flag_value or os.environ.get(ENV_TOKEN_SHA256)
    path = flag_file or os.environ.get(ENV_TOKEN_SHA256_FILE)
    if not value and path:
        value = Path(path).read_text().strip()
    if not value:
        return None
    value = value.strip().lower()
    if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise ValueError("the token hash must be 64 hex characters (SHA-256)")
    return value


def parse_probe(text: str) -> Any:
    """--readiness-probe: a Kubernetes Probe as JSON (validated by readiness.py)."""
    import json

    from sandman.daemon.readiness import Probe

    try:
        doc = json.loads(text)
    except ValueError as e:
        raise ValueError(f"--readiness-probe is not JSON: {e}") from None
    return Probe.from_json(doc)


def parse_python_dirs(value: str) -> tuple[Path, ...] | None:
    """--python-dirs: "auto" (found at start), "none", or DIR[:DIR...]."""
    if value == "auto":
        return None
    if value == "none":
        return ()
    dirs = tuple(Path(p) for p in value.split(":") if p)
    if not all(d.is_absolute() for d in dirs):
        raise ValueError(f"--python-dirs wants auto, none or absolute DIR[:DIR...], got {value!r}")
    return dirs


def from_args(args: argparse.Namespace) -> DaemonConfig:
    host, port = parse_listen(args.listen)
    workspace = args.workspace or os.environ.get(ENV_WORKSPACE)
    manifests = [*(args.manifest or []), *parse_manifests(os.environ.get(ENV_MANIFESTS))]
    return DaemonConfig(
        host=host,
        port=port,
        token_sha256=read_token_hash(args.token_sha256, args.token_sha256_file),
        daemon_dir=Path(args.daemon_dir),
        allowed_roots=tuple(Path(p) for p in (args.allow_root or ["/"])),
        workspace=Path(workspace) if workspace else None,
        manifest_files=tuple(Path(p) for p in dict.fromkeys(manifests)),
        python_dirs=parse_python_dirs(args.python_dirs),
        temp_dirs=tuple(Path(p) for p in args.temp_dir or ["/tmp", "/var/tmp"]),
        command=tuple(args.command),
        grace_s=args.grace,
        exit_with_command=args.exit_with_command,
        no_reset=args.no_reset,
        readiness_probe=parse_probe(args.readiness_probe) if args.readiness_probe else None,
    )
