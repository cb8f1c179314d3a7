"""Sifting a listing while it is read (``orphans.sift``): against one and the same view, an observation that holds
only the ids of the cleared machines classifies exactly as the whole listing does, whatever the world."""

from __future__ import annotations

import itertools
from operator import attrgetter

import attrs
from hypothesis import event, given, settings
from hypothesis import strategies as st
from orphan_world import CLUSTER, NOW, PROVIDER
from test_properties import EPOCH, PROTECT, REFS, _fact, facts, memories, observations, policies

from provisionerd.domain.model import (
    TAG_CLUSTER,
    TAG_PROVIDER,
    CommittedFact,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    ProviderMachine,
)
from provisionerd.orphans.classify import ClassifierMemory, Observation, OrphanPolicy, Unreadable, classify
from provisionerd.orphans.sift import Sifting, SiftKeys
from provisionerd.planner.fact_view import FactView, fold
from provisionerd.provider.paging import PageJoin


def cleared_by(machine: ProviderMachine, keys: SiftKeys) -> object:
    """The fact that clears ``machine`` (a page of it alone sifted), or ``None``."""
    sifting = Sifting()
    return None if sifting.page([machine], keys) else keys.machines[sifting.cleared_ids[0]]


def hosts_by_ref(hosts: tuple[HostState, ...]) -> dict[str, HostState]:
    """Host states by instance ref, as the session keeps them (``ControllerView.hosts``): the last of a ref wins."""
    return {host.instance_ref: host for host in hosts if host.instance_ref}


def joined(listing: tuple[ProviderMachine, ...], cuts: list[int]) -> tuple[ProviderMachine, ...]:
    """``listing`` read in pages cut at ``cuts`` and joined as the client joins them (the later copy of an id wins)."""
    join: PageJoin[ProviderMachine] = PageJoin("p", "listMachines", 100, 100, attrgetter("machine_id"))
    for n, rows in enumerate(pages(listing, cuts)):
        join.add(rows, f"c{n}")
    return join.items


def pages(listing: tuple[ProviderMachine, ...], cuts: list[int]) -> list[tuple[ProviderMachine, ...]]:
    bounds = sorted({0, len(listing), *(c for c in cuts if c <= len(listing))})
    return [listing[a:b] for a, b in itertools.pairwise(bounds)]


def sifted(obs: Observation, policy: OrphanPolicy, cuts: list[int]) -> Observation:
    """``obs`` as the orphan pass observes it: each page sifted (``Sifting``), the kept rows joined, then resolved."""
    if not isinstance(obs.listing, tuple) or not isinstance(obs.view, FactView):
        return obs
    machines, hosts = obs.view.machines, hosts_by_ref(obs.hosts)
    keys = SiftKeys(obs.cluster_id, obs.provider, policy.protect_tag, machines, hosts, obs.now, policy.join_deadline)
    sifting = Sifting()
    join: PageJoin[ProviderMachine] = PageJoin("p", "listMachines", 100, 100, attrgetter("machine_id"))
    for n, rows in enumerate(pages(obs.listing, cuts)):
        join.add(sifting.page(rows, keys), f"c{n}", size=len(rows))
    listing, cleared = sifting.resolve(join.items)
    event(f"cleared {min(len(cleared), 2)}")
    return attrs.evolve(obs, listing=listing, cleared=cleared)


@st.composite
def near_cleared(draw: st.DrawFn) -> Observation:
    """An observation where many listed machines have their fact and a host (so they are cleared), and others miss one
    piece of it, are another provider's, returning, adopted or lost: the edge of clearing."""
    obs = draw(observations())
    if not isinstance(obs.listing, tuple):
        return obs
    made, hosts = list(draw(facts())), list(obs.hosts)
    for machine in obs.listing:
        if draw(st.integers(0, 3)) == 0:
            continue
        provider = draw(st.sampled_from([PROVIDER, PROVIDER, PROVIDER, "other"]))
        ref = draw(st.sampled_from(REFS))
        fact = InstanceFact(provider, EPOCH, "op-s", ref, machine.machine_id, "t", "0" * 64, "", "", NOW - 5000)
        made.append(CommittedFact(len(made) + 1, fact))
        after = draw(st.sampled_from(["", "", "", "return", "returned", "lost", "adopted"]))
        if after:
            made.append(CommittedFact(len(made) + 1, _fact(draw, after, provider, "op-s", machine.machine_id)))
        if draw(st.integers(0, 3)):
            host_provider = draw(st.sampled_from([PROVIDER, PROVIDER, PROVIDER, "other"]))
            status = draw(st.sampled_from(list(HostStatus)))
            hosts.append(HostState(ref, host_provider, draw(st.sampled_from(["", machine.machine_id])), status, NOW))
    return attrs.evolve(obs, view=fold(made), hosts=tuple(hosts))


@settings(max_examples=600, deadline=None)
@given(st.one_of(observations(), near_cleared()), policies, memories, st.lists(st.integers(0, 10), max_size=4))
def test_a_sifted_observation_classifies_as_the_joined_listing(obs: Observation, policy, memory, cuts) -> None:
    """Against one and the same view, page by page, the same classification as the whole listing joined (which
    keeps the later copy of an id), and no listed id lost."""
    policy = attrs.evolve(policy, protect_tag=PROTECT)
    if isinstance(obs.listing, tuple):
        obs = attrs.evolve(obs, listing=joined(obs.listing, cuts))
    lean = sifted(obs, policy, cuts)
    assert classify(lean, policy, memory) == classify(obs, policy, memory)
    if isinstance(obs.listing, tuple):
        assert {m.machine_id for m in lean.listing} | lean.cleared == {m.machine_id for m in obs.listing}


@settings(max_examples=600, deadline=None)
@given(st.one_of(observations(), near_cleared()), st.lists(st.integers(0, 10), max_size=4))
def test_a_copy_of_an_id_cleared_or_kept_gives_way_to_a_later_one(obs: Observation, cuts) -> None:
    """Sifting the raw pages, then resolving, ends as sifting the joined listing: each id once, its later copy's."""
    if not isinstance(obs.listing, tuple) or not isinstance(obs.view, FactView):
        return
    policy = OrphanPolicy(join_deadline=900.0, protect_tag=PROTECT)
    once = sifted(attrs.evolve(obs, listing=joined(obs.listing, cuts)), policy, [])
    lean = sifted(obs, policy, cuts)
    assert (lean.listing, lean.cleared) == (once.listing, once.cleared)


def test_an_active_joined_machine_is_cleared_and_anything_else_is_kept() -> None:
    ours = {TAG_CLUSTER: CLUSTER, TAG_PROVIDER: PROVIDER}
    fact = InstanceFact(PROVIDER, Epoch(4, 2), "op", "ref-1", "m1", "t", "0" * 64, "h", "10.0.0.1", NOW - 10)
    view = fold([CommittedFact(1, fact)])
    host = HostState("ref-1", PROVIDER, "m1", HostStatus.IDLE, NOW)
    keys = SiftKeys(CLUSTER, PROVIDER, PROTECT, view.machines, {"ref-1": host})
    machine = ProviderMachine("m1", "h", "succeed", "running", NOW - 10, "10.0.0.1", "ref-1", ours)
    assert cleared_by(machine, keys) is view.machines["m1"]
    sifting = Sifting()
    assert sifting.page([machine], keys) == [] and sifting.cleared_ids == ["m1"]
    for other in (
        attrs.evolve(machine, tags={**ours, PROTECT: ""}),  # protected: the classifier reads its tag
        attrs.evolve(machine, status="terminated"),
        attrs.evolve(machine, tags={TAG_CLUSTER: CLUSTER, TAG_PROVIDER: "other"}),
        attrs.evolve(machine, machine_id="m2"),  # no fact
    ):
        assert cleared_by(other, keys) is None
    for other_keys in (
        attrs.evolve(keys, hosts={}),  # never joined, and no join deadline
        attrs.evolve(keys, hosts={"ref-1": attrs.evolve(host, provider="other")}),
        attrs.evolve(keys, cluster_id=""),
        attrs.evolve(keys, hosts={}, now=NOW, join_deadline=10.0),  # its join deadline passed
    ):
        assert cleared_by(machine, other_keys) is None
    young = attrs.evolve(keys, hosts={}, now=NOW, join_deadline=10.5)  # not joined, still on its way up
    assert cleared_by(machine, young) is view.machines["m1"]
    # A listing without a usable launch time is timed by the fact's (``detect.launch_of``), the listing's first.
    for unknown in (0.0, float("nan"), -1.0):
        assert cleared_by(attrs.evolve(machine, launch_time=unknown), young) is view.machines["m1"]
    assert cleared_by(attrs.evolve(machine, launch_time=NOW - 20), young) is None


def test_an_unreadable_view_clears_nothing() -> None:
    obs = Observation(CLUSTER, PROVIDER, NOW, (), Unreadable("y"))
    assert sifted(obs, OrphanPolicy(), []) is obs
    assert classify(obs, OrphanPolicy(), ClassifierMemory()).findings == ()
