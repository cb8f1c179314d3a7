"""Machine health in the pure planner (issue 20, items 1 and 2): a joined machine's capability report checked
against its template by the offers' compatibility function, and ``max_unhealthy`` stopping replacement."""

from __future__ import annotations

import attrs
from hypothesis import given
from hypothesis import strategies as st
from reconcile_world import CLUSTER, NOW, World, fuzz_settings, item, offer, snapshot

from provisionerd.domain.actions import RequestMachines, ReturnMachines
from provisionerd.domain.model import HostState, HostStatus
from provisionerd.planner import health
from provisionerd.planner.policy import Policy, ProviderPolicy

GOOD = {"ncpus": "4", "mem": "8000", "type": "X86_64", "ngpus": "1"}
BAD = {**GOOD, "ngpus": "0"}


def gpu_world(policy: Policy | None = None, *, good_price: float = 0.2, bad_price: float = 0.1) -> World:
    """Two 1-GPU templates of provider p: ``bad`` (cheaper, chosen first) and ``good``."""
    offers = [offer(template="bad", gpus=1, price=bad_price), offer(template="good", gpus=1, price=good_price)]
    return World(offers, policy=policy or Policy(cluster=CLUSTER, providers={"p": ProviderPolicy()}))


def join(world: World, machine_id: str, capabilities: dict[str, str], status: HostStatus = HostStatus.IDLE) -> None:
    machine = world.view.machines[machine_id]
    world.hosts[machine.instance_ref] = HostState(
        machine.instance_ref, "p", machine_id, status, world.now, capabilities=capabilities
    )


def requests(result) -> list[RequestMachines]:
    return [a for a in result.actions if isinstance(a, RequestMachines)]


def returns(result) -> list[ReturnMachines]:
    return [a for a in result.actions if isinstance(a, ReturnMachines)]


def gpu_item(count: int = 1):
    return item("d", count, ncpus=1, gpus=1)


# --- the comparison --------------------------------------------------------------------------------------------


def test_a_report_short_of_its_template_reads_like_a_rejected_offer() -> None:
    template = offer(gpus=1, ncpus=4, mem=8192)
    assert health.capability_shortfall(template, GOOD) == ()
    assert health.capability_shortfall(template, BAD) == ("ngpus 0 < 1 required",)
    assert health.capability_shortfall(template, {**GOOD, "ncpus": "2"}) == ("ncpus 2 < 4 required",)
    # Memory may be 10% under the template's (MemTotal is below a cloud's nominal size), not more.
    assert health.capability_shortfall(template, {**GOOD, "mem": "7500"}) == ()
    assert health.capability_shortfall(template, {**GOOD, "mem": "7000"}) == ("mem 7000 MiB < 7372 MiB required",)
    assert health.capability_shortfall(template, {**GOOD, "type": "aarch64"}) == (
        "type (arch) 'aarch64' != 'x86_64' required",
    )
    # A probe that failed reports no number: that falls short too.
    failed = health.capability_shortfall(template, {**GOOD, "ngpus": "!exit 127"})
    assert "ngpus value ('Numeric', '!exit 127') is not a number" in failed and "ngpus 0 < 1 required" in failed
    # What the template does not declare is not judged, whatever the machine reports.
    assert health.capability_shortfall(template, {**GOOD, "zone": "a", "extra": "x"}) == ()


def test_a_machine_must_confirm_every_attribute_of_its_template() -> None:
    """Issue 35 item 1: a missing attribute is a shortfall, not a pass."""
    template = offer(gpus=1, ncpus=4, mem=8192)
    assert health.capability_shortfall(template, {}) == (
        "mem not reported ('8192' declared)",
        "ncpus not reported ('4' declared)",
        "ngpus not reported ('1' declared)",
        "type not reported ('X86_64' declared)",
    )
    # A CPU-only report of a GPU template: the GPUs it does not mention are not taken on trust.
    assert health.capability_shortfall(template, {k: v for k, v in GOOD.items() if k != "ngpus"}) == (
        "ngpus not reported ('1' declared)",
    )
    # A template of no GPUs asks for no GPU report: nothing can fall short of 0.
    assert health.capability_shortfall(offer(gpus=0), {"ncpus": "4", "mem": "8192", "type": "X86_64"}) == ()
    # A feature (a Boolean attribute declared true) must be confirmed, in the template's own text; a String
    # attribute that describes the offer (a zone) is compared only when reported.
    featured = offer(gpus=0, zone="z1")
    featured = attrs.evolve(featured, attributes={**featured.attributes, "infiniband": ("Boolean", "1")})
    plain = {"ncpus": "4", "mem": "8192", "type": "X86_64"}
    assert health.capability_shortfall(featured, plain) == ("infiniband not reported ('1' declared)",)
    assert health.capability_shortfall(featured, {**plain, "infiniband": "1"}) == ()
    assert health.capability_shortfall(featured, {**plain, "infiniband": "0"}) == (
        "attribute infiniband '0' != '1' required",
    )
    assert health.capability_shortfall(featured, {**plain, "infiniband": "1", "zone": "z2"}) == (
        "attribute zone 'z2' != 'z1' required",
    )
    # One architecture under another tool's name is the same architecture; another is not.
    arm = offer(gpus=0, arch="arm64")
    assert health.capability_shortfall(arm, {**plain, "type": "AARCH64"}) == ()
    assert health.capability_shortfall(offer(gpus=0, arch="amd64"), plain) == ()
    assert health.capability_shortfall(arm, plain) == ("type (arch) 'x86_64' != 'arm64' required",)
    # What a machine with exactly the template reports passes.
    assert health.capability_shortfall(featured, health.confirming_report(featured)) == ()


@fuzz_settings(200)
@given(
    gpus=st.integers(0, 8),
    dropped=st.sets(st.sampled_from(["ncpus", "mem", "ngpus", "type"])),
)
def test_every_declared_attribute_left_out_of_the_report_is_named(gpus: int, dropped: set[str]) -> None:
    template = offer(gpus=gpus)
    report = {k: v for k, v in health.confirming_report(template).items() if k not in dropped}
    reasons = health.capability_shortfall(template, report)
    named = {r.split(" ", 1)[0] for r in reasons}
    assert named == {n for n in dropped if n != "ngpus" or gpus > 0}
    assert all(r.endswith("declared)") for r in reasons)


@fuzz_settings(300)
@given(
    declared=st.integers(0, 64),
    have=st.integers(0, 64),
    ncpus=st.integers(1, 128),
    have_cpus=st.integers(1, 128),
)
def test_a_machine_falls_short_exactly_when_it_has_less_than_declared(
    declared: int, have: int, ncpus: int, have_cpus: int
) -> None:
    template = offer(gpus=declared, ncpus=ncpus)
    report = {**health.confirming_report(template), "ngpus": str(have), "ncpus": str(have_cpus)}
    reasons = health.capability_shortfall(template, report)
    assert any(r.startswith("ngpus") for r in reasons) == (have < declared)
    assert any(r.startswith("ncpus") for r in reasons) == (have_cpus < ncpus)
    assert len(reasons) == (have < declared) + (have_cpus < ncpus)


# --- in the plan -----------------------------------------------------------------------------------------------


def test_a_machine_short_of_its_template_is_returned_with_the_reason_and_replaced_from_another_offer() -> None:
    world = gpu_world()
    first = world.plan(snapshot(1, gpu_item()))
    (ask,) = requests(first)
    assert ask.template_id == "bad"
    world.commit_actions(first.actions)
    (machine_id,) = world.fulfil(ask.op_id)
    join(world, machine_id, BAD)
    world.now += 1
    second = world.plan(snapshot(1, gpu_item()))
    (back,) = returns(second)
    assert back.machine_ids == (machine_id,)
    assert back.reason == "capability_mismatch: ngpus 0 < 1 required"
    (replacement,) = requests(second)  # the same pass replaces it, from the next offer: "bad" is suspect
    assert replacement.template_id == "good" and replacement.count == 1
    assert ("capability_mismatch", "p") in {(n.kind, n.provider) for n in second.notes}
    (decision,) = second.decisions
    (blocked,) = decision.blocked
    assert blocked.template_id == "bad" and blocked.reasons[0].startswith("suspect until")
    assert second.wake_at == NOW + 1 + ProviderPolicy().capacity_backoff  # when the offer stops being suspect
    # Replaying the same inputs plans nothing new (invariant 6).
    world.commit_actions(second.actions)
    assert world.plan(snapshot(1, gpu_item())).actions == ()
    # The good machine joins, passes, and counts as supply: demand met, nothing more.
    (good_id,) = world.fulfil(replacement.op_id)
    join(world, good_id, GOOD)
    world.returned(back)
    assert world.plan(snapshot(1, gpu_item())).actions == ()
    # Once the back-off is over the offer is chosen again (a bad machine may have been a one-off).
    world.now += ProviderPolicy().capacity_backoff
    third = world.plan(snapshot(1, gpu_item(2)))
    assert [a.template_id for a in requests(third)] == ["bad"]


def test_a_busy_machine_is_never_returned_and_a_report_that_passes_is_supply() -> None:
    world = gpu_world()
    first = world.plan(snapshot(1, gpu_item(2)))
    world.commit_actions(first.actions)
    (ask,) = requests(first)
    busy, fine = world.fulfil(ask.op_id)
    join(world, busy, BAD, HostStatus.BUSY)
    join(world, fine, GOOD)
    assert world.plan(snapshot(1, gpu_item(2))).actions == ()


# --- max_unhealthy ---------------------------------------------------------------------------------------------


def protected_world(**own) -> World:
    return gpu_world(Policy(cluster=CLUSTER, providers={"p": ProviderPolicy(**own)}), good_price=0.1, bad_price=0.2)


def test_more_unhealthy_machines_than_max_unhealthy_stops_replacement_and_says_why() -> None:
    world = protected_world(max_unhealthy=1, max_unhealthy_window=600.0, capacity_backoff=1.0)
    first = world.plan(snapshot(1, gpu_item(3)))
    world.commit_actions(first.actions)
    machine_ids = [m for a in requests(first) for m in world.fulfil(a.op_id)]
    assert len(machine_ids) == 3
    for machine_id in machine_ids:
        join(world, machine_id, BAD)
    world.now += 1
    second = world.plan(snapshot(1, gpu_item(3)))
    # All three go back (they serve nothing), none is replaced: 3 unhealthy > max_unhealthy 1.
    assert sorted(m for r in returns(second) for m in r.machine_ids) == sorted(machine_ids)
    assert requests(second) == []
    (note,) = [n for n in second.notes if n.kind == "provider_protected"]
    assert "3 unhealthy machines within 600s, more than max_unhealthy 1" in note.detail
    shown = health.status(second.state.unhealthy, "p", 3, world.now, ProviderPolicy(max_unhealthy=1))
    assert shown["protected"] is True and shown["unhealthy"] == 3 and "replacement stopped" in str(shown["reason"])
    # Protection ends when the window holds no more than max_unhealthy findings: the 2nd oldest leaves it (the
    # plan wakes at the earlier end of the offers' suspicion first).
    found = health.protection(second.state.unhealthy, "p", 3, world.now, ProviderPolicy(max_unhealthy=1))
    assert found is not None and found.eases_at == world.now + 600.0
    assert second.wake_at == world.now + 1.0
    world.commit_actions(second.actions)
    for action in returns(second):
        world.returned(action)
    world.now += 599
    assert requests(world.plan(snapshot(1, gpu_item(3)))) == []
    world.now += 1
    assert sum(a.count for a in requests(world.plan(snapshot(1, gpu_item(3))))) == 3


def test_at_most_max_unhealthy_machines_are_replaced_as_usual() -> None:
    world = protected_world(max_unhealthy=1, capacity_backoff=1.0)
    first = world.plan(snapshot(1, gpu_item(1)))
    world.commit_actions(first.actions)
    (machine_id,) = world.fulfil(requests(first)[0].op_id)
    join(world, machine_id, BAD)
    world.now += 2
    second = world.plan(snapshot(1, gpu_item(1)))
    assert len(returns(second)) == 1 and sum(a.count for a in requests(second)) == 1
    assert not [n for n in second.notes if n.kind == "provider_protected"]


def test_never_joined_and_lost_machines_are_unhealthy_too_and_the_percent_rounds_up() -> None:
    assert health.allowance(ProviderPolicy(max_unhealthy_percent=40.0), 5) == 2
    assert health.allowance(ProviderPolicy(max_unhealthy_percent=40.0, max_unhealthy=1), 5) == 1
    assert health.allowance(ProviderPolicy(), 5) is None
    world = protected_world(max_unhealthy_percent=40.0, join_deadline=100.0)
    first = world.plan(snapshot(1, gpu_item(5)))
    world.commit_actions(first.actions)
    machine_ids = [m for a in requests(first) for m in world.fulfil(a.op_id)]
    world.now += 101  # none joined: all five are never_joined, 5 > 40% of 5 (2)
    second = world.plan(snapshot(1, gpu_item(5)))
    assert {r.reason for r in returns(second)} == {"never_joined"}
    assert requests(second) == []
    assert len(second.state.unhealthy) == len(machine_ids) == 5


@fuzz_settings(200)
@given(
    times=st.lists(st.floats(0, 1000, allow_nan=False), max_size=12),
    max_unhealthy=st.integers(0, 5),
    window=st.floats(1, 500),
    now=st.floats(0, 1500),
)
def test_protected_exactly_when_the_window_holds_more_than_max_unhealthy(
    times: list[float], max_unhealthy: int, window: float, now: float
) -> None:
    own = ProviderPolicy(max_unhealthy=max_unhealthy, max_unhealthy_window=window)
    log = tuple(sorted((t, "p", f"m{i}") for i, t in enumerate(times) if t <= now))
    inside = [t for t, _, _ in log if t + window > now]  # the one comparison health uses (float rounding)
    found = health.protection(log, "p", 10, now, own)
    assert (found is not None) == (len(inside) > max_unhealthy)
    if found is not None:
        assert found.eases_at > now
        # At eases_at, no more than max_unhealthy findings are left in the window.
        assert health.protection(log, "p", 10, found.eases_at, own) is None
    # Recording is idempotent per machine and keeps only the window.
    kept = [("p", m) for t, _, m in log if t + window > now]
    again = health.recorded(log, [*kept, *kept], now, {"p": window})
    assert len(again) == len(inside)
    assert len(health.recorded(again, [("p", "new"), ("p", "new")], now, {"p": window})) == len(inside) + 1


def test_the_log_is_bounded_per_provider() -> None:
    findings = [("p", f"m{i}") for i in range(health.MAX_LOGGED + 5)] + [("q", "x")]
    log = health.recorded((), findings, NOW, {"p": 600.0, "q": 600.0})
    assert sum(1 for e in log if e[1] == "p") == health.MAX_LOGGED and ("q" in {e[1] for e in log})
