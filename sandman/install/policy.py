"""The sandbox policy `sandman install` installs: the admin chooses the registries.

The release's policy admits images only from the local harness's loopback
registry (``127.0.0.1:5000/*``), so installed as is on any other cluster it
denies every sandbox. An install therefore names the registries
(``--allow-registry GLOB``, repeatable: the release's policy with those
globs) or a whole policy (``--policy FILE``), and refuses a policy that
admits nothing outside a loopback registry unless ``--local-harness`` says
that is the point. The policy is read with the webhook's own parser and
report (``sandman policy check``), so what is refused here is what the
webhook would refuse, and what is printed is what it will apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sandman.cli.policy import report
from sandman.install import apply as ap
from sandman.install import render

SHIPPED = Path("webhook") / "policy.yaml"  # under the release's manifests
CHOOSE = (
    "choose the registries sandboxes may pull from: --allow-registry GLOB (repeatable, e.g. "
    "--allow-registry 'docker.io/*' --allow-registry 'ghcr.io/ORG/*') or --policy FILE (a "
    "SandboxPolicy, docs/policy.md; check it with `sandman policy check FILE`)"
)


class PolicyChoiceError(ValueError):
    """The flags choose no policy, or one the webhook would reject or that admits
    nothing outside the local harness."""


@dataclass(frozen=True)
class Chosen:
    text: str  # the SandboxPolicy for the ConfigMap
    origin: str  # where it came from, for the summary
    lines: tuple[str, ...]  # mode and registries per rule set, then warnings


def shipped_policy_manifest() -> str:
    return (ap.manifests_dir() / SHIPPED).read_text()


def choose(
    allow_registries: Sequence[str],
    policy_file: Path | None,
    *,
    local_harness: bool = False,
    shipped: str | None = None,
) -> Chosen:
    """The policy the flags choose, checked as the webhook reads it; PolicyChoiceError
    (its message says which flag to use) for none, or for one not to install."""
    r = report()
    if allow_registries and policy_file is not None:
        raise PolicyChoiceError(
            "--allow-registry and --policy together: put the registries in the file's "
            "allowedRegistries, or use only --allow-registry"
        )
    if policy_file is not None:
        try:
            text = r.policy_text(policy_file.read_text())
        except OSError as e:
            raise PolicyChoiceError(f"--policy {policy_file}: {e}") from None
        except r.PolicyError as e:
            raise PolicyChoiceError(f"--policy {policy_file}: {e}") from None
        origin = f"--policy {policy_file}"
    elif allow_registries:
        manifest = shipped if shipped is not None else shipped_policy_manifest()
        text = render.policy_with_registries(manifest, tuple(allow_registries))
        origin = "the release's policy with --allow-registry " + " ".join(allow_registries)
    elif local_harness:
        manifest = shipped if shipped is not None else shipped_policy_manifest()
        text = r.policy_text(manifest)
        origin = "the release's policy (--local-harness)"
    else:
        raise PolicyChoiceError(
            f"{CHOOSE}; the release's policy admits only the local harness's registry "
            "127.0.0.1:5000/* and would deny every other image"
        )
    try:
        policy = r.load(text)
    except r.PolicyError as e:
        raise PolicyChoiceError(f"{origin}: the webhook would reject this policy: {e}") from None
    if r.admits_only_loopback(policy) and not local_harness:
        raise PolicyChoiceError(
            f"{origin} admits images only from a loopback registry "
            f"({', '.join(sorted({p for x in policy.rules for p in x.allowed_registries}))}), "
            "which only the local harness cluster has: every sandbox would be denied; "
            f"{CHOOSE}, or pass --local-harness if this cluster is the local harness"
        )
    lines = [f"sandbox policy ({origin}):"]
    lines += [f"  {s}" for s in r.summary(policy)]
    lines += [f"warning: {w}" for w in r.warnings(policy, local_harness=local_harness)]
    return Chosen(text, origin, tuple(lines))
