"""Which of a legacy plugin's own requests a lost call made: the one rule, pure (issue 31, item 2: "its machines are
adopted into the op").

A legacy ``requestMachines`` whose answer is lost (the plugin killed mid-call, its output gone) is an unknown
outcome: the plugin cannot be listed, so what it made had no fact (``bench/restarts.py``, legacy, 30 min: 14
machines running unexplained after 8 plugin kills). Where the plugin's own state file can be read
(``[providers.legacy] state_file``, ``legacy.state_files``), the request the lost call made is usually there. It is
taken as the call's answer only when nothing else can have made it:

- it is not a request the journal knows (``known``: every requestId an answered call gave);
- its template is the call's, it names exactly as many machines as the call asked for, and one of them is not
  terminated (a request whose machines are all gone needs nobody);
- when the plugin recorded when it made them (``created_ms`` > 0), not before the call started nor after it ended
  (with ``SKEW_MS`` of clock skew);
- it is the **only** such request, and the call is the only one with an unknown outcome that could have made it
  (same template and count, and running when it was made, where the times are known): two lost calls and two
  candidates are not told apart by guessing.

Otherwise ``None``: the call stays an unknown outcome (failed, never retried, named by the orphan report).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

from provisionerd.provider.legacy.state_files import PluginRequest

#: Tolerated difference between the daemon's clock at the call's start and the plugin's record of its machines.
SKEW_MS = 5_000


@attrs.frozen
class LostCall:
    template_id: str
    count: int
    started_ms: int = 0  # wall clock at the call's start (0: not recorded)
    ended_ms: int = 0  # wall clock by which it had ended (0: not known)

    def could_have_made(self, request: PluginRequest) -> bool:
        """Whether this call may have made ``request``: same template and count, and (where both times are known)
        the request was made while the call ran. A call that ended before a request was made did not make it
        (seed 84 of the legacy simulation: a lost call that had made nothing blocked, as a rival, every later lost
        call of the same shape from ever being attributed)."""
        if (request.template_id, len(request.machines)) != (self.template_id, self.count):
            return False
        if not request.created_ms:
            return True
        after_start = not self.started_ms or request.created_ms >= self.started_ms - SKEW_MS
        before_end = not self.ended_ms or request.created_ms <= self.ended_ms + SKEW_MS
        return after_start and before_end


def request_of_lost_call(
    call: LostCall, requests: Sequence[PluginRequest], known: Collection[str], rivals: Sequence[LostCall] = ()
) -> PluginRequest | None:
    """The plugin request only ``call`` can have made, or ``None`` (module docstring). ``rivals``: the other calls
    whose outcome is unknown."""
    candidates = [
        request
        for request in requests
        if request.request_id not in known
        and any(m.status != "terminated" for m in request.machines)
        and call.could_have_made(request)
    ]
    if len(candidates) != 1 or any(r.could_have_made(candidates[0]) for r in rivals):
        return None
    return candidates[0]
