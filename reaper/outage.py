"""Leases and webhook outages: the rule, pure.

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

What counts as an outage is one of two things, and nothing else:

- **stopped**: this reaper saw the webhook serve (its ``/readyz``), then saw
  it fail. A webhook that has not served since the reaper started is not
  "stopped": right after an install the webhook is still starting, and
  holding every lease then kept a 15 s lease for over a minute.
- **the apiserver failed to call it**: the apiserver's own count of
  UPDATEs it refused because it could not call this webhook rose
  (``apiserver_admission_webhook_rejection_count{error_type=
  "calling_webhook_error"}``, read by ``probe.py`` while the webhook is not
  seen serving). That is exactly "an extension was refused for the outage",
  whoever the reaper can or cannot reach.

While the webhook is not seen serving, a lease that ended after the last
reading of that count waits for the next reading (a few seconds): the
failure may have happened since. If the count cannot be read, the reaper
cannot tell, and holds (never delete on a guess).
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass

from sandman.contract import format_time

# Two minutes: several SDK retries of a refused extension (backoff up to 30 s)
# and a human noticing an alert, and short next to any lease.
DEFAULT_GRACE = dt.timedelta(minutes=2)


class Kind(enum.Enum):
    STOPPED = "stopped"  # seen serving by this reaper, then failing
    CALL_FAILED = "call_failed"  # the apiserver failed to call it
    UNKNOWN = "unknown"  # the reaper cannot tell (the count is unreadable)


@dataclass(frozen=True)
class Observation:
    """One probe: ``serving`` is the webhook's own answer (or no webhook is
    configured); ``call_failures`` is whether the apiserver's failure count
    rose since the last reading (None: not read, or unreadable)."""

    at: dt.datetime
    serving: bool
    call_failures: bool | None = None


@dataclass(frozen=True)
class Outage:
    kind: Kind
    start: dt.datetime
    end: dt.datetime | None = None  # None: still going on

    def describe(self) -> str:
        at = format_time(self.start)
        if self.kind is Kind.STOPPED:
            what = f"the admission webhook stopped serving at {at}"
        elif self.kind is Kind.CALL_FAILED:
            what = f"the apiserver failed to call the admission webhook at {at}"
        else:
            what = f"the reaper could not tell whether the admission webhook admits since {at}"
        return what if self.end is None else f"{what} (back at {format_time(self.end)})"


@dataclass(frozen=True)
class Hold:
    """Look at the lease again at ``until``. ``outage`` None: a short wait for
    the next probe, not worth an Event."""

    until: dt.datetime
    outage: Outage | None = None


@dataclass
class AdmissionHealth:
    """What the reaper knows of the webhook's availability. Event-loop only.

    Prevents deleting sandboxes whose lease extensions the webhook could not
    admit, and (the ``serving_seen`` gate) holding every lease while a newly
    installed webhook is still starting. Keeps only the last outage: the one
    that can overlap a lease ending now (an earlier one ended before it began).
    """

    known: bool = False  # a probe has answered (either way)
    serving_seen: bool = False  # this reaper has seen the webhook serve
    serving: bool = False  # the last probe saw it serve
    current: Outage | None = None
    last: Outage | None = None
    # The last probe that tells: the webhook served, or the count was read.
    checked_at: dt.datetime | None = None

    def observe(self, o: Observation) -> None:
        self.known, self.serving = True, o.serving
        if o.serving:
            self.serving_seen, self.checked_at = True, o.at
            self._end(o.at)
            return
        if self.serving_seen:
            kind: Kind | None = Kind.STOPPED
        elif o.call_failures is None:
            kind = Kind.UNKNOWN
        else:
            kind = Kind.CALL_FAILED if o.call_failures else None
        if o.call_failures is not None or self.serving_seen:
            self.checked_at = o.at
        if kind is None and self.current is not None and self.current.kind is Kind.UNKNOWN:
            # The count covers the unreadable stretch too (it is read against
            # the last good reading): nothing failed in it.
            self.current = None
        elif kind is None:
            self._end(o.at)
        elif self.current is None or self.current.kind is not kind:
            self._end(o.at)
            self.current = Outage(kind, o.at)

    def _end(self, at: dt.datetime) -> None:
        if self.current is not None:
            self.last, self.current = Outage(self.current.kind, self.current.start, at), None

    def hold_until(
        self, lease_end: dt.datetime, now: dt.datetime, grace: dt.timedelta
    ) -> Hold | None:
        """When a lease that ended at ``lease_end`` may be reclaimed; None: now."""
        if grace <= dt.timedelta(0):
            return None
        if not self.known:
            return Hold(now)  # the first probe answers within its period
        if self.current is not None:
            return Hold(now, self.current)  # still down: look again after the next probe
        if not self.serving and (self.checked_at is None or self.checked_at < lease_end):
            return Hold(now)  # the next reading tells whether it failed since
        last = self.last
        end = last.end if last is not None else None
        if last is not None and end is not None and end > lease_end - grace and end + grace > now:
            return Hold(end + grace, last)
        return None
