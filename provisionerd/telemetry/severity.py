"""How loud each event kind is in the human log: one table, one level per kind.

The events stream (JSON lines, ``telemetry.events``) keeps every event whatever its level; this table decides only
what the human log shows at the configured ``log_level``. The rule (issue 32): a fault an operator must act on or
know about is WARNING or ERROR, so ``log_level = "warning"`` still shows a controller outage, a lost lease, a
provider that refuses its credentials, an amnesiac controller, a failed reload and a storage failure; what happens
on every cycle of an idle fleet (lease renewals every TTL/3, offer reads, orphan passes, same-link refreshes) is
DEBUG, so that an idle fleet writes under 100 lines an hour at INFO; the rest (a change of state an operator may
want to read back) is INFO.

A kind missing from the table is logged at INFO (``level_of``); a test keeps every kind the code emits in the table.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from types import MappingProxyType

DEBUG, INFO, WARNING, ERROR = logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR

SEVERITY: Mapping[str, int] = MappingProxyType(
    {
        # --- the controller link: an outage or a refused join is a fault; a (re)join is news ---
        "link_down": WARNING,
        "join_refused": WARNING,
        "link_up": INFO,
        "join": INFO,
        "redirect": INFO,
        "resync": INFO,
        "refresh": DEBUG,  # a later resync on the same link, every refresh_heartbeats heartbeats
        # --- leases ---
        "lease_lost": WARNING,
        "lease_unusable": ERROR,  # the provider will not run under this config
        "lease_acquired": INFO,
        "lease_renewed": DEBUG,  # every TTL/3 per provider: the bulk of an idle fleet's lines
        "lease_denied": INFO,  # a standby's routine answer (another daemon holds it)
        "lease_releasing": INFO,
        "lease_released": INFO,
        "lease_freed": INFO,
        # --- the controller's memory and storage ---
        "controller_amnesia": ERROR,  # every mutation stops until an admin decides
        "controller_reset_accepted": WARNING,  # an admin's override, kept visible
        "controller_storage_failure": ERROR,
        # --- providers ---
        "provider_unhealthy": WARNING,  # auth_failed, quota, unreachable...
        "provider_healthy": INFO,
        "offers_failed": WARNING,
        "offers": DEBUG,  # every offer_interval per provider
        "step_changed": INFO,
        # --- operations (the execution layer) ---
        "action": INFO,  # planned, called, result, recovery, dropped, deferred, crashed
        "gate": DEBUG,  # each mutation's gate decision; the action's own lines say what happened
        "request_outcome_unknown": WARNING,
        "return_stuck": WARNING,
        "reclaimed": INFO,
        "plan_note": INFO,  # emitted when a note appears, not every cycle
        "reconcile_skipped": INFO,  # emitted when the reason changes
        "windows_restored": INFO,  # once a start: the health windows read back from the facts (planner.windows)
        "windows_not_restored": WARNING,  # they start empty: max_unhealthy and the budget forget what came before
        # --- orphans ---
        "orphan_pass": DEBUG,  # every orphans.interval per provider
        "orphan_detected": WARNING,
        "orphan_action": INFO,
        "orphan_resolved": INFO,
        # --- the daemon itself ---
        "config_reload_failed": ERROR,
        "config_reloaded": INFO,
        "config_restart_needed": WARNING,  # a reload named changes that wait for a restart
        "metrics_listen_failed": ERROR,
        "daemon_started": INFO,
        "daemon_stopping": INFO,
        "daemon_stopped": INFO,
        "systemd_ready": INFO,
        "watchdog_stalled": WARNING,
        "watchdog_resumed": INFO,
    }
)


def level_of(event: str) -> int:
    """The ``logging`` level of ``event``'s line in the human log (INFO for a kind the table does not name)."""
    return SEVERITY.get(event, INFO)
