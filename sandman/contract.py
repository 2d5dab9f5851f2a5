"""The pod contract (design section 2): every name and its parsing, in one place.

Every component reads and writes sandbox pods through these names and
parsers, so that the webhook, the reaper, the extender, the daemon and the SDK
can never disagree about what a label means or how "90m" is read. It imports
only the standard library: the daemon is frozen with it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from typing import Any

PREFIX = "sandman.dev/"

# -- inputs a user may set ---------------------------------------------------------
LABEL_SANDBOX = PREFIX + "sandbox"  # "true": opt in; nothing else is touched
ANN_TTL = PREFIX + "ttl"  # hard lifetime, e.g. "90m"
ANN_IDLE_TIMEOUT = PREFIX + "idle-timeout"  # reclaim after this long without API calls
ANN_CONTAINER = PREFIX + "container"  # which container gets the daemon
ANN_PROFILE = PREFIX + "profile"  # policy profile, e.g. "eval", "rollout"
ANN_TOKEN_SHA256 = PREFIX + "token-sha256"  # client-chosen token hash (hex)
ANN_WORKSPACE = PREFIX + "workspace"  # git checkout /v1/reset restores
ANN_EXIT_WITH_COMMAND = PREFIX + "exit-with-command"  # "true": the pod ends with its command
# Files and directories /v1/reset verifies by content (comma-separated absolute paths).
ANN_MANIFESTS = PREFIX + "manifests"
# "none": the pod may not reach the network (NetworkPolicy sandman-eval-offline,
# manifests/sandbox-namespace); eval tasks get it unless they ask for network.
LABEL_NETWORK = PREFIX + "network"
NETWORK_NONE = "none"

# -- outputs the system writes --------------------------------------------------------
ANN_INJECTED = PREFIX + "injected"  # daemon version; the idempotency marker
LABEL_ID = PREFIX + "id"  # random sandbox id (the token is derived from it)
ANN_EXPIRES_AT = PREFIX + "expires-at"  # RFC 3339; clients may move it later
ANN_ENTRYPOINT_FROM = PREFIX + "entrypoint-from"  # image@digest whose ENTRYPOINT/CMD runs
ANN_ADMITTED = PREFIX + "admitted"  # admission marker: only the webhook can compute it
ANN_KEY_ID = PREFIX + "key-id"  # generation of the cluster key the token derives from
LABEL_POOL = PREFIX + "pool"
LABEL_STATE = PREFIX + "state"  # warm pools: STATE_IDLE until claimed
LABEL_CLAIM = PREFIX + "claim"  # CLAIM_HELD from the moment a pool pod is claimed
LABEL_RUN = PREFIX + "run"  # every pod of one fleet run
LABEL_NODE_KIND = PREFIX + "node-kind"  # local cluster nodes: "kwok" | "real"
LABEL_BENCH = PREFIX + "bench"  # nodes and pods a benchmark made (value: its name)
LABEL_E2B = PREFIX + "e2b"  # "true": made by the E2B gateway (the only pods it acts on)
ANN_E2B_TEMPLATE = PREFIX + "e2b-template"  # the E2B template id it was created from
ANN_E2B_METADATA = PREFIX + "e2b-metadata"  # E2B metadata, a JSON object of strings

# -- values of sandman.dev/state and sandman.dev/claim ------------------------------
STATE_IDLE = "idle"  # in a warm pool, claimable
STATE_CLAIMED = "claimed"  # taken out of its pool by a claim
STATE_QUARANTINED = "quarantined"  # kept by a fleet after its reset found drift
CLAIM_HELD = "held"  # pool controllers may not delete it (validating webhook)

# -- warm pools ----------------------------------------------------------------------
ANN_CLAIMED_BY = PREFIX + "claimed-by"
ANN_CLAIMED_AT = PREFIX + "claimed-at"
ANN_POOL_STATUS = PREFIX + "pool-status"  # JSON health summary, on the ReplicaSet
ANN_POOL_IMAGE = PREFIX + "pool-image"  # on the ReplicaSet
POOL_RS_PREFIX = "pool-"  # a pool is the ReplicaSet pool-<name>

SCHEDULER_NAME = "sandman-scheduler"
POLICY_API_VERSION = PREFIX + "v1alpha1"  # the admin's SandboxPolicy file

# -- what the webhook injects and the daemon reads (the webhook <-> daemon contract) --
DAEMON_PORT = 7878
DAEMON_DIR = "/.sandman"  # the daemon's own files; the agent may not touch them
DAEMON_PORT_NAME = "sandman"
DAEMON_VOLUME = "sandman-daemon"
DAEMON_INIT_CONTAINER = "sandman-install"
# The daemon's runtime tree (interpreter + modules) inside DAEMON_DIR, and how
# it is started; the ELF interpreter path baked into the tree is absolute, so
# this path is fixed (harness/images/daemon_binary.py builds it).
DAEMON_RUNTIME_DIR = DAEMON_DIR + "/rt"
DAEMON_ARGV = (DAEMON_RUNTIME_DIR + "/bin/sandmand", "-I", "-S", "-m", "sandman.daemon")
# Opt-in shared mode: a node directory (hostPath) holding each daemon tree
# once per node, mounted read-only into sandboxes here.
DAEMON_SHARED_VOLUME = "sandman-daemon-shared"
DAEMON_SHARED_MOUNT = DAEMON_DIR + "/shared"
# The "node" delivery: a DaemonSet installs each daemon image's tree in the
# node directory ahead of time and names it RELEASES/<daemon_release(image)>;
# a sandbox mounts that read-only at DAEMON_RUNTIME_DIR and has no install
# step at all (docs/performance.md "Delivery").
DAEMON_RELEASES = "release"


def daemon_release(image: str) -> str:
    """The node directory's name for a daemon image's tree, computed from the
    image reference alone: the webhook and the node installer are both given
    the same reference (one kustomize image name rewrites both)."""
    return hashlib.sha256(image.encode()).hexdigest()[:16]


ENV_TOKEN_SHA256 = "SANDMAN_TOKEN_SHA256"  # SHA-256 (hex) of the sandbox's token
ENV_TOKEN_SHA256_FILE = "SANDMAN_TOKEN_SHA256_FILE"  # ... or a file holding it
ENV_WORKSPACE = "SANDMAN_WORKSPACE"  # the git checkout /v1/reset restores
ENV_TMPDIR_ORIG = "SANDMAN_TMPDIR_ORIG"  # the image's own TMPDIR, handed back to commands
ENV_MANIFESTS = "SANDMAN_MANIFESTS"  # ANN_MANIFESTS's value, for the daemon
# The last chunk of a daemon stream that failed after its 200 (a tar whose
# source changed mid-way), before the connection is cut: this marker, a JSON
# object {"code", "message"} and a newline. Clients report it as the error.
STREAM_ERROR_MARKER = b"\n--sandman-stream-error-- "
# SDK process: serve the pool manager's metrics (GET /metrics) on HOST:PORT.
ENV_METRICS_LISTEN = "SANDMAN_METRICS_LISTEN"
NAMESPACE = "sandman-system"
ACCESS_SECRET = "sandman-access"  # per-namespace key Secret (design section 5)

# Event reasons (stable: alerts and dashboards key on them).
REASON_INJECTED = "SandboxInjected"
REASON_POLICY_DENIED = "PolicyDenied"
REASON_LEASE_EXPIRED = "LeaseExpired"
REASON_IDLE = "IdleReclaimed"
REASON_STUCK = "StuckReclaimed"
REASON_STUCK_REPORTED = "SandboxStuck"  # a controller-owned sandbox left to its owner
REASON_EXITED = "Exited"
REASON_KEY_RETIRED = "KeyRetired"  # admitted under a cluster key generation now retired
REASON_LEASE_HELD = "LeaseHeld"  # lease ended while extensions could not be admitted
REASON_UNVERIFIED = "SandboxUnverified"  # no valid admission marker: the reaper keeps off
# Namespaces the reaper never acts in, whatever a pod there is labeled.
SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease", NAMESPACE})
REASON_SCHEDULER_NOT_RUNNING = "SchedulerNotRunning"  # a sandbox names a stopped scheduler
# On the policy ConfigMap: a new policy text in force, or refused (the previous stays).
REASON_POLICY_LOADED = "PolicyLoaded"
REASON_POLICY_REJECTED = "PolicyRejected"

# ASCII digits only: \d would also take Arabic-Indic or full-width digits,
# which no Kubernetes tool writes and a reviewer would not read as numbers.
_DURATION = re.compile(r"([0-9]+(?:\.[0-9]+)?)(ms|s|m|h|d)", re.ASCII)
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
# The longest duration the contract reads: ten years is far past any lease,
# idle timeout or stuck limit, and far enough from datetime's year 9999 that
# "now + duration" can never overflow (a bare "99999999999d" made the webhook
# answer 500 and the reaper fail on that pod forever).
MAX_DURATION = dt.timedelta(days=3650)
_MAX_TEXT = "3650d"
# Longer than any duration or timestamp written by a person or a tool.
_MAX_LEN = 64


class ContractError(ValueError):
    """A pod field that does not follow the contract; the message says how to fix it."""


def _text(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise ContractError(f"{field}: expected a string, got {type(value).__name__}")
    if len(value) > _MAX_LEN:
        raise ContractError(f"{field}: {value[:_MAX_LEN]!r}... is too long")
    return value


MAX_MANIFESTS = 64  # paths in sandman.dev/manifests; each is walked at start and per reset
_MAX_MANIFESTS_LEN = 16384


def parse_manifests(value: object, *, field: str = ANN_MANIFESTS) -> tuple[str, ...]:
    """sandman.dev/manifests: absolute paths of files or directories that
    /v1/reset verifies by content, separated by commas or newlines."""
    if value is None or value == "":
        return ()
    if not isinstance(value, str):
        raise ContractError(f"{field}: expected a string, got {type(value).__name__}")
    if len(value) > _MAX_MANIFESTS_LEN:
        raise ContractError(f"{field}: longer than {_MAX_MANIFESTS_LEN} characters")
    paths = [p.strip() for p in re.split(r"[,\n]", value) if p.strip()]
    if len(paths) > MAX_MANIFESTS:
        raise ContractError(f"{field}: {len(paths)} paths, at most {MAX_MANIFESTS}")
    for p in paths:
        if not p.startswith("/") or "\0" in p or ".." in p.split("/"):
            raise ContractError(
                f"{field}: {p[:100]!r} is not an absolute path without '..' "
                "(e.g. /app/requirements.lock,/usr/local/lib/python3.11/site-packages)"
            )
    return tuple(paths)


def duration_seconds(text: str) -> float | None:
    """The seconds of a Go-style duration ("1h30m", "500ms"), or None when
    ``text`` is not one: the grammar alone, no range (the CLI's flags share it)."""
    pos, total = 0, 0.0
    for m in _DURATION.finditer(text):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    return total if text and pos == len(text) else None


def parse_duration(value: str, *, field: str = "duration") -> dt.timedelta:
    """Go-style durations: "90m", "1h30m", "45s", "2d", "1.5h". Positive, at most 3650d."""
    text = _text(value, field).strip(" ")
    total = duration_seconds(text)
    if total is None:
        raise ContractError(
            f"{field}: {value!r} is not a duration; use forms like 90m, 1h30m, 45s, 2d"
        )
    if total <= 0:
        raise ContractError(f"{field}: must be positive, got {value!r}")
    if total > MAX_DURATION.total_seconds():
        raise ContractError(f"{field}: {value!r} is out of range; use at most {_MAX_TEXT}")
    return dt.timedelta(seconds=total)


def format_duration(td: dt.timedelta) -> str:
    s = int(td.total_seconds())
    out = ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if s >= size:
            out += f"{s // size}{unit}"
            s %= size
    return out or "0s"


def format_time(t: dt.datetime) -> str:
    """RFC 3339 in UTC with a Z, second precision (as Kubernetes writes times)."""
    return t.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str, *, field: str = "time") -> dt.datetime:
    """An RFC 3339 time with a zone, returned in UTC."""
    text = _text(value, field)
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ContractError(f"{field}: {value!r} is not an RFC 3339 time") from None
    if t.tzinfo is None:
        raise ContractError(f"{field}: {value!r} has no time zone; use ...Z")
    try:
        return t.astimezone(dt.UTC)
    except OverflowError:
        raise ContractError(f"{field}: {value!r} is out of range") from None


def is_sandbox(pod: dict[str, Any]) -> bool:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_SANDBOX) == "true"


def annotations(pod: dict[str, Any]) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("annotations") or {}


def labels(pod: dict[str, Any]) -> dict[str, str]:
    return (pod.get("metadata") or {}).get("labels") or {}


def controller_of(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod's controlling owner reference (a pool's ReplicaSet, a Job), or None."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def is_token_hash(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value)


# Warm pools (Events on the pool's ReplicaSet).
REASON_POOL_FAILING = "PoolFailing"  # its pods cannot start; the pool stops growing
REASON_POOL_RECOVERED = "PoolRecovered"
