"""Leases and webhook outages: the rule, pure (issue 15 item 4).

A client extends a lease by moving ``sandman.dev/expires-at``, an UPDATE that
the validating webhook must admit (``failurePolicy: Fail``). While the webhook
is down no extension can be written, yet leases keep ending: reclaiming them
then would delete sandboxes whose users did everything right.

The rule: **a lease is not reclaimed while the webhook cannot admit
extensions, nor before the webhook has been back for the extension grace
(2 min by default) when it was down at any time in the grace before the
lease ended.** Clients thereby get the grace to retry a refused extension.
Everything else (idleness, stuck, exited) is unaffected, and the kubelet's
``activeDeadlineSeconds`` (the policy's maximum lifetime, set at admission)
still ends every sandbox, so a webhook that never comes back cannot keep
sandboxes forever. No webhook configuration at all means no webhook in the
way of extensions: nothing is held.

Availability is what the reaper sees when it sends the webhook a review of
its own, the way the apiserver would (``reaper/probe.py``), every few seconds.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

# Two minutes: several SDK retries of a refused extension (backoff up to 30 s)
# and a human noticing an alert, and short next to any lease.
DEFAULT_GRACE = dt.timedelta(minutes=2)


@dataclass
class AdmissionHealth:
    """What the reaper knows of the webhook's availability. Event-loop only.

    Prevents deleting sandboxes whose lease extensions the webhook could not
    admit. Keeps only the last outage: the one that can overlap a lease
    ending now (an earlier one ended before it began).
    """

    known: bool = False  # a probe has answered (either way) or no webhook is configured
    down_since: dt.datetime | None = None  # the current outage, if any
    last_outage_end: dt.datetime | None = None
    last_outage_start: dt.datetime | None = None

    def observe(self, now: dt.datetime, ok: bool) -> None:
        self.known = True
        if not ok and self.down_since is None:
            self.down_since = now
        elif ok and self.down_since is not None:
            self.last_outage_start, self.last_outage_end = self.down_since, now
            self.down_since = None

    def hold_until(
        self, lease_end: dt.datetime, now: dt.datetime, grace: dt.timedelta
    ) -> dt.datetime | None:
        """When a lease that ended at ``lease_end`` may be reclaimed; None: now.

        ``now + a probe`` while the webhook is down or not probed yet (the
        caller looks again then); the end of the last outage plus the grace
        when that outage overlapped the grace before the lease ended.
        """
        if grace <= dt.timedelta(0):
            return None
        if not self.known or self.down_since is not None:
            return now  # unknown or down: look again after the next probe
        end = self.last_outage_end
        if end is not None and end > lease_end - grace and end + grace > now:
            return end + grace
        return None
