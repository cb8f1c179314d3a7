"""The settle window after a (re)join to a controller, and the machines known to have joined before it.

A controller's host table is volatile: after a controller restart it is empty until the workers rejoin, and after
a failover the new primary knows only the workers that reached it. So "no host for this machine" right after a
(re)join proves nothing, and reading it as "never joined" returned healthy machines, busy ones included, on every
controller restart (issue 31, finding 1).

Two rules, both in :func:`provisionerd.planner.supply.tally`:

- **A machine that joined once is never ``never_joined``.** ``Rejoin.joined_before`` names the instance refs that
  had a host at any time (kept by the controller session across generations, so a controller restart does not
  empty it, and in ``joined.<cluster>.txt`` across daemon restarts: ``controller.joined_file``). Such a machine with
  no host counts as supply; once the window below has passed and it still has no host, it is returned as
  ``not_rejoined`` (it lost contact), never as never joined.
- **Nothing is retired for not joining until the window has passed**: ``rejoin_settle`` seconds after the
  (re)join, or sooner, once every machine of the provider that joined before has a host again, for a machine this
  generation saw the whole life of (launched after the view came up). Any other machine with no host may have
  joined while this process saw nothing (before it started, or during a link outage: seeds 434 and 272546480) at a
  controller that has restarted since, so it waits the whole window, and is then returned as ``no_host``, not as
  never joined: ``never_joined`` is said only of a machine this generation saw the whole life of (seed 779519691:
  a join stalled on its way to the daemon, the machine vanished, the controller restarted), never of an adopted one
  (seed 734516497: a machine that had joined the controller's lost incarnation, adopted after the reset).
- **Nor for its capabilities until the machines that joined before are back** (or the window timed out): a host
  in view is judged by the report it joined with.

- **A host table read as "no host" is confirmed first.** Host states come as pushes, and a lost push is not seen
  by the heartbeat digest when a later push carries a higher seq (seed 272546760: the push of a join dropped, the
  machine returned as never joined 78 s later). A machine is retired for not joining only from a view resynced
  after the planner asked for one (``Rejoin.hosts_confirmed``); until then the plan says so
  (``Plan.confirm_joins``) and the loop asks the session for a resync. Such retirements are rare, so the extra
  resync costs little.

Pure: the loop passes ``Rejoin(since, joined_before, first_view, hosts_confirmed)`` with times on the planner's
clock (``now``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set

import attrs

from provisionerd.planner.fact_view import MachineRecord

#: The retire reason of a machine that joined once and has no host after the settle window.
NOT_REJOINED = "not_rejoined"
#: The retire reason of a machine with no host after the window whose history this process could not see (it was
#: launched before the current view came up): it may have joined unseen, so it is not called "never joined".
NO_HOST = "no_host"


@attrs.frozen
class Rejoin:
    """``since``: when the current controller generation's view came up (the planner's clock). ``joined_before``:
    instance refs known to have joined (read only; the session adds to it). ``first_view``: when this process saw
    its first view (``joined_before`` says nothing of the time before it)."""

    since: float
    joined_before: Set[str] = frozenset()
    first_view: float = float("-inf")
    #: The hosts come from a resync sent after the planner last asked for one (``Plan.confirm_joins``).
    hosts_confirmed: bool = True


#: No (re)join to wait for (tests, tools): every window has passed and no machine is known as joined before.
SETTLED = Rejoin(float("-inf"))


class Window:
    """Whether each provider's settle window has passed at ``now``, computed once per provider per pass.

    ``unjoined``: the active machines with no host (instance_ref -> machine); ``settle_of(provider)``: that
    provider's ``rejoin_settle``. The expected machines still missing are counted only while a window is open
    (O(machines not joined) once per pass), so a settled daemon pays nothing.
    """

    def __init__(
        self,
        rejoin: Rejoin,
        unjoined: Mapping[str, MachineRecord],
        now: float,
        settle_of: Callable[[str], float],
    ) -> None:
        self.rejoin, self._unjoined, self._now, self._settle_of = rejoin, unjoined, now, settle_of
        self._missing: dict[str, int] | None = None
        self._settled: dict[str, bool] = {}

    def joined_before(self, machine: MachineRecord) -> bool:
        return machine.instance_ref in self.rejoin.joined_before

    def until(self, provider: str) -> float:
        """When ``provider``'s window ends at the latest."""
        return self.rejoin.since + self._settle_of(provider)

    def settled(self, provider: str) -> bool:
        """``provider``'s window has passed for every machine: timed out, or (past the process's first view) every
        machine of it that joined before has a host again."""
        known = self._settled.get(provider)
        if known is None:
            timed_out = self._now >= self.until(provider)
            first = self.rejoin.since <= self.rejoin.first_view
            known = self._settled[provider] = timed_out or (not first and not self.missing(provider))
        return known

    def hosts_back(self, provider: str) -> bool:
        """Every machine of ``provider`` that joined before has a host again (or the window timed out): a host in
        view may be judged by its report (its capabilities), whatever this process saw before."""
        return self._now >= self.until(provider) or not self.missing(provider)

    def settled_for(self, machine: MachineRecord) -> bool:
        """The window has passed for ``machine``, which has no host now: its provider's window timed out, or this
        generation saw its whole life (launched after the view came up, never seen with a host). Any other machine
        may have joined while this process saw nothing (before it started, or during a link outage) at a controller
        that has restarted since, so it waits for the timeout."""
        if self._now >= self.until(machine.provider):
            return True
        if self.joined_before(machine):
            return False
        return machine.launch_time > 0 and machine.launch_time >= self.rejoin.since

    def missing(self, provider: str) -> int:
        """How many of ``provider``'s machines that joined before have no host now."""
        if self._missing is None:
            before = self.rejoin.joined_before
            self._missing = {}
            if before:
                for ref, machine in self._unjoined.items():
                    if ref in before:
                        self._missing[machine.provider] = self._missing.get(machine.provider, 0) + 1
        return self._missing.get(provider, 0)

    def reason(self, machine: MachineRecord, launched: float) -> str:
        """Why ``machine``, without a host past its join deadline and the window, is returned: ``not_rejoined``
        (it joined before), ``never_joined`` (this generation saw its whole life: ``launched``, its launch time or,
        unknown, when the planner first saw it, is not before the view came up), else ``no_host``."""
        if self.joined_before(machine):
            return NOT_REJOINED
        if machine.adopted:  # an orphan taken over: nothing of its life before the adoption was seen
            return NO_HOST
        return "never_joined" if launched >= self.rejoin.since else NO_HOST
