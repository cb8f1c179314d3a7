"""When the reconcile loop must plan again even if nothing changes: the earliest deadline after ``now``.

Pure. Two sources, both cheap at 100,000 machines:

- what the last plan found on its own pass (``Plan.wake_at``): the next idle machine reaching its provider's
  ``idle_time`` (only the idle machines demand does not need are read, as the plan reads them anyway), the next
  join deadline (the earliest not-joined launch is the top of ``HostTable``'s heap), the next ``max_ttl`` and the
  next drain timeout (``planner.drain``; read only when a provider has a ``max_ttl``), the next provisioning
  timeout (one per open intent), and the step window freeing room when the step held demand back;
- the back-off windows in the planner state: a throttle, an offer out of capacity, an unhealthy provider's next
  probe, the controller's intent refusals (a handful of entries per provider).

The loop sleeps until the earlier of that deadline and ``replan_interval`` (which stays the cap: recovery of
intents nobody runs and the offers' refresh need it), instead of ticking every ``replan_interval``.
"""

from __future__ import annotations

from provisionerd.planner.state import PlannerState

#: How long after a plan's own deadline to plan. Half a second late at most (the tick was up to ``replan_interval``,
#: 10 s, late), and in return the machines whose deadlines fall within that half second go in one call (machines
#: that joined together go idle together: one ``returnMachines`` for them, not one each); the clock read then is
#: also safely past the deadline after float rounding. The back-off windows need none: they end when
#: ``now >= until``, at the instant itself.
PLAN_SLACK = 0.5


def next_deadline(state: PlannerState, now: float, planned: float | None = None) -> float | None:
    """The earliest time after ``now`` (wall seconds, the planner's clock) at which a plan would decide something
    new from unchanged inputs: ``planned`` (the last ``Plan.wake_at``, plus ``PLAN_SLACK``) or the end of a back-off
    window in ``state``. ``None``: no deadline is known (the loop waits for a change or ``replan_interval``)."""
    capacity = state.capacity
    ends = [
        *(t.until for t in capacity.throttles.values()),
        *capacity.unavailable.values(),
        *(u.until for u in capacity.unhealthy.values()),
        state.intent_backoff.until,
    ]
    if planned is not None:
        ends.append(planned + PLAN_SLACK)
    return min((end for end in ends if end > now), default=None)
