"""The mutation permit a provider call runs under, carried with the call (a context variable).

The mutation gate (``execution.gate``) admits one provider mutation at a time: an acknowledged intent under the
lease held at that instant. Most plugins make one mutation per call. A legacy LSF plugin with per-machine userData is
called once per machine inside one ``requestMachines`` (``provider.legacy.adapter``): each of those later calls is a
mutation of its own, and must not start once the lease that admitted the op is gone (found by the simulation's
legacy worlds, seed 178276053: a controller amnesia took the lease between two calls, and the second one ran). The
gate sets ``CURRENT_PERMIT`` around the body it admits; the adapter asks it before each call after the first.
Nothing else reads it, and without a permit (a test, ``provisionerd orphans``) nothing changes.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol


class StillPermitted(Protocol):
    def valid(self) -> bool:
        """Whether the lease that admitted the mutation is still held, in the same epoch, and nothing halted."""


CURRENT_PERMIT: ContextVar[StillPermitted | None] = ContextVar("provisionerd_mutation_permit", default=None)
