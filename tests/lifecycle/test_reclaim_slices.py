"""The reclaim poll at fleet size: every live machine of the provider is named once, in chunks, and picking them
out of the view never holds the loop for the whole fleet (issue 36: no loop step grows with the fleet). A plugin
that declares ``reclaimsByTags`` is asked once by the cluster's tag, and only its own live machines are taken."""

from __future__ import annotations

import gc
import math
from collections.abc import Mapping, Sequence

import trio
import trio.testing

from provisionerd.controller.session_settings import LinkState
from provisionerd.controller.view import ControllerView
from provisionerd.domain.model import CommittedFact, Epoch, InstanceFact, RequestIntent, Returned, ReturnIntent
from provisionerd.execution import reclaims
from provisionerd.execution.reclaims import ReclaimPoll
from provisionerd.execution.values import ExecutorSettings
from provisionerd.planner.fact_view import FactView
from provisionerd.planner.state import Observation, Reclaimed
from provisionerd.provider.paging import RECLAIM_CHUNK
from provisionerd.provider.values import Features, MachineRef, Reclaim
from provisionerd.telemetry.events import EventLog

EPOCH = Epoch(1, 1)
MINE = 23_457  # live machines of the polled provider: more than two scan slices, twelve chunks
RETURNED = 40  # of them, returned: never named


def view() -> ControllerView:
    facts = FactView(prune=True)
    index = 0

    def commit(fact: object) -> None:
        nonlocal index
        index += 1
        facts.apply(CommittedFact(index, fact))  # type: ignore[arg-type]

    for provider, count in (("mine", MINE + RETURNED), ("other", 3000)):
        for start in range(0, count, 1000):
            op = f"{provider}-op-{start}"
            refs = tuple(f"c/{provider}-{n}" for n in range(start, min(start + 1000, count)))
            commit(RequestIntent(provider, EPOCH, op, "t", len(refs), refs, tuple("0" * 64 for _ in refs), "d"))
            for ref in refs:
                n = ref.rsplit("-", 1)[1]
                commit(InstanceFact(provider, EPOCH, op, ref, f"{provider}-i-{n}", "t", "0" * 64, f"h{n}", "", 1.0))
    gone = tuple(f"mine-i-{n}" for n in range(RETURNED))
    commit(ReturnIntent("mine", EPOCH, "ret-1", gone, "idle"))
    commit(Returned("mine", EPOCH, "ret-1", gone, 2.0))
    return ControllerView(1, "p", 1, facts, facts.hosts)


class Client:
    def __init__(self, wanted: str, by_tags: Sequence[Reclaim] = ()) -> None:
        self.asked: list[list[str]] = []
        self.tags: list[Mapping[str, str] | None] = []
        self.collecting: list[bool] = []  # whether the cyclic collector ran during each call
        self._wanted = wanted
        self._by_tags = tuple(by_tags)

    async def get_return_requests(
        self, refs: Sequence[MachineRef], *, tags: Mapping[str, str] | None = None
    ) -> tuple[Reclaim, ...]:
        self.asked.append([r.machine_id for r in refs])
        self.tags.append(tags)
        self.collecting.append(gc.isenabled())
        named = tuple(Reclaim(r.name, r.machine_id) for r in refs if r.machine_id == self._wanted)
        return named + (self._by_tags if tags is not None else ())


class Book:
    """The executor's ``FeatureBook``: what ``describeProvider`` said."""

    def __init__(self, features: Features) -> None:
        self._features = features

    async def read(self, provider: str) -> Features | None:
        return self._features


class Executor:
    def __init__(self, client: Client, features: Features | None = None) -> None:
        self._client = client
        self.features = Book(features or Features())
        self.settings = ExecutorSettings(cluster="c", controllers=("ctl:1",))

    def client(self, provider: str) -> Client:
        assert provider == "mine"
        return self._client


class Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.count = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        self.count += 1


def run_poll(
    current: ControllerView, client: Client, features: Features | None = None
) -> tuple[list[Observation], Steps]:
    """One poll of provider "mine" over ``current``: what it applied and the loop's steps meanwhile."""
    applied: list[Observation] = []

    class Session:
        view = current
        state = LinkState.UP

    poll = ReclaimPoll(
        Session(),  # type: ignore[arg-type]
        Executor(client, features),  # type: ignore[arg-type]
        EventLog(),
        30.0,
        leased=lambda: ["mine"],
        apply=applied.append,
        wall=lambda: 5.0,
    )
    steps = Steps()

    async def main() -> None:
        trio.lowlevel.add_instrument(steps)
        await poll.poll("mine", current)

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return applied, steps


def test_every_live_machine_is_named_once_in_chunks_and_the_scan_takes_a_step_a_slice() -> None:
    current = view()
    wanted = f"mine-i-{MINE + RETURNED - 7}"  # in the last chunk
    client = Client(wanted)
    applied, steps = run_poll(current, client)
    named = [machine_id for chunk in client.asked for machine_id in chunk]
    assert len(named) == len(set(named)) == MINE
    assert set(named) == {f"mine-i-{n}" for n in range(RETURNED, MINE + RETURNED)}
    assert [len(chunk) for chunk in client.asked[:-1]] == [RECLAIM_CHUNK] * (len(client.asked) - 1)
    assert applied == [Reclaimed("mine", (wanted,), 5.0)]
    # One step at least per slice of the view scanned and per chunk asked: no step reads the whole fleet.
    scanned = len(current.facts.machines)
    assert steps.count >= math.ceil(scanned / reclaims.SCAN_SLICE) + len(client.asked)
    # A poll of the fleet's size pauses the cyclic collector while it asks (its refs are acyclic), and resumes it.
    assert client.collecting == [False] * len(client.asked) and gc.isenabled()


def poll_by_tags(answer: Sequence[Reclaim]) -> tuple[Client, list[Observation]]:
    client = Client("", answer)
    applied, _steps = run_poll(view(), client, Features(reclaims_by_tags=True))
    return client, applied


def test_a_plugin_that_reclaims_by_tags_is_asked_once_naming_no_machine() -> None:
    client, applied = poll_by_tags(())
    assert client.asked == [[]] and client.tags == [{"provisionerd:cluster": "c"}]
    assert applied == []


def test_by_tags_only_the_providers_own_live_machines_are_taken() -> None:
    answer = (
        Reclaim("h500", "mine-i-500"),  # live, ours: taken
        Reclaim("", "mine-i-3"),  # returned (one of the first RETURNED): not ours to drain any more
        Reclaim("h7", "other-i-7"),  # another provider's machine
        Reclaim("ghost", "i-never-made"),  # no fact at all
        Reclaim("h900"),  # by name only, as an LSF-style plugin answers: found by its hostname
        Reclaim("h8", "i-unknown"),  # an id not ours is not taken by its name either
    )
    client, applied = poll_by_tags(answer)
    assert len(client.asked) == 1
    assert applied == [Reclaimed("mine", ("mine-i-500", "mine-i-900"), 5.0)]
