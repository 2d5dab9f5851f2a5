"""Install every Debian package the harness and the test tiers need, up front.

`.ci/run` calls ``python -m sandman.harness.prereqs`` before `make test`, so
that no tier or test is skipped on a fresh machine for want of a package (the
real node would install them on demand too, but tests that build images or
chroots run before or without it).
"""

from __future__ import annotations

import sys

from sandman.harness.cluster.hostsetup import (
    REQUIREMENTS,
    HostSetupError,
    Requirement,
    ensure_packages,
    missing_packages,
    real_node_unsupported_reason,
)

# Tools only the tests use (not the real node): Prometheus's promtool checks
# the alert rules and the components' metrics (tests/integration/test_monitoring.py).
TEST_TOOLS = (
    Requirement("promtool", "prometheus"),
    # The CLI runs under Debian's own python3.11 (3.11.2, the oldest Python we
    # support: no tarfile filters) in a venv (tests/e2e/test_kubectl_user.py).
    Requirement("/usr/lib/python3.11/ensurepip/__init__.py", "python3.11-venv"),
    # `sandman completion zsh` is sourced into zsh (tests/unit/cli/test_completion.py).
    Requirement("zsh", "zsh"),
)
ALL = (*REQUIREMENTS, *TEST_TOOLS)


def main() -> int:
    why = real_node_unsupported_reason()
    if why:
        print(f"prereqs: {why}", file=sys.stderr)
        return 1
    try:
        ensure_packages(lambda m: print(f"prereqs: {m}", flush=True), ALL)
    except HostSetupError as e:
        print(f"prereqs: {e}", file=sys.stderr)
        return 1
    left = missing_packages(ALL)
    print("prereqs: all installed" if not left else f"prereqs: missing {left}")
    return 0 if not left else 1


if __name__ == "__main__":
    sys.exit(main())
