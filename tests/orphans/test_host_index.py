"""The host index the classifier matches machines against: built in one comprehension when every value is distinct
and non-empty, host by host otherwise; either way the same index."""

from __future__ import annotations

from operator import attrgetter

from hypothesis import given
from hypothesis import strategies as st

from provisionerd.domain.model import HostState, HostStatus
from provisionerd.orphans.hosts import HostIndex, _add, _index
from provisionerd.planner.fact_view import FactView

VALUES = st.sampled_from(["", "a", "b", "c", "d"])
HOSTS = st.lists(
    st.builds(
        HostState,
        instance_ref=VALUES,
        provider=st.sampled_from(["sim", "other"]),
        machine_id=VALUES,
        status=st.sampled_from(list(HostStatus)),
        since=st.just(1.0),
        hostname=VALUES,
        address=VALUES,
    ),
    max_size=8,
)
FIELDS = ("instance_ref", "machine_id", "hostname", "address")


def host_by_host(hosts: list[HostState], field: str) -> dict[str, object]:
    index: dict[str, object] = {}
    for host in hosts:
        _add(index, getattr(host, field), host)
    return index


@given(HOSTS, st.sampled_from(FIELDS))
def test_the_index_is_the_host_by_host_one_whatever_repeats_or_is_empty(hosts: list[HostState], field: str) -> None:
    assert _index(hosts, attrgetter(field)) == host_by_host(hosts, field)


def test_distinct_values_take_the_comprehension_and_a_repeat_keeps_both_hosts() -> None:
    one, two = (HostState(f"r{n}", "sim", f"i-{n}", HostStatus.IDLE, 1.0, "same") for n in (1, 2))
    assert _index([one, two], attrgetter("instance_ref")) == {"r1": one, "r2": two}
    assert _index([one, two], attrgetter("hostname")) == {"same": [one, two]}


@given(HOSTS, VALUES, VALUES)
def test_joined_is_an_identity_match_of_this_providers_hosts(hosts: list[HostState], mid: str, ref: str) -> None:
    index = HostIndex(hosts, "sim", FactView())
    ours = [h for h in hosts if h.provider == "sim"]
    expected = any((ref and h.instance_ref == ref) or (mid and h.machine_id == mid) for h in ours)
    assert index.joined(mid, ref) is expected
