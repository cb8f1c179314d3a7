"""Resource limits per provider (issue 35 item 3): ``max_gpus``, ``max_ncpus`` and ``max_mem_mb`` count every
machine of the provider (live, requested, in flight) from its template, like ``max_machines``; a request is cut to
what fits, an offer of which not one more machine fits is skipped, and the reason names the limit with its figures.
The planner alone (pure), then hypothesis over mixed templates, then the config."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reconcile_world import CLUSTER, EPOCH, World, item, offer, snapshot
from rigs.daemon import parsed_config

from provisionerd.daemon.builder import policy_from_config
from provisionerd.domain.actions import RequestMachines
from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import RequestIntent
from provisionerd.planner.policy import Policy, ProviderPolicy

GPU = "gpu"


def policy(**limits: int) -> Policy:
    return Policy(cluster=CLUSTER, step_limit=1000, providers={GPU: ProviderPolicy(**limits)})


def gpu_world(p: Policy) -> World:
    # The 4-GPU template is cheaper per machine: without the limit it would take every machine asked for.
    return World([offer(GPU, "g2", gpus=2, price=2.0), offer(GPU, "g4", gpus=4, price=1.0)], policy=p)


def gpus_requested(result, w: World) -> int:
    per = {"g2": 2, "g4": 4}
    return sum(per[a.template_id] * a.count for a in result.actions if isinstance(a, RequestMachines))


def test_a_gpu_limit_of_8_holds_with_2_and_4_gpu_templates_mixed() -> None:
    w = gpu_world(policy(max_gpus=8))
    result = w.plan(snapshot(1, item("big", 3, gpus=4), item("small", 3, gpus=2)))
    asked = {(a.demand_id, a.template_id): a.count for a in result.actions if isinstance(a, RequestMachines)}
    assert asked == {("big", "g4"): 2}  # 8 GPUs: two 4-GPU machines; no room is left for "small"
    decision = next(d for d in result.decisions if d.demand_id == "small")
    reasons = [r for rej in (*decision.blocked, *decision.filled) for r in rej.reasons]
    assert any(r.startswith("max_gpus 8/8 (provider limit") for r in reasons), reasons
    note = next(n for n in result.notes if n.kind == "unmet_demand" and n.demand_id == "small")
    assert "max_gpus 8/8" in note.detail


def test_a_request_is_cut_to_what_fits_and_machines_in_flight_count() -> None:
    w = gpu_world(policy(max_gpus=10))
    op_id = f"{CLUSTER}:{GPU}:seed:0"
    w.commit(RequestIntent(GPU, EPOCH, op_id, "g4", 1, (f"{op_id}/0",), ("h" * 64,), "d"))  # 4 GPUs on their way
    result = w.plan(snapshot(1, item("d", 4, gpus=2)))
    # 6 GPUs left: one more 4-GPU machine (the cheapest) fits, then one 2-GPU machine.
    assert gpus_requested(result, w) == 6
    asked = {a.template_id: a.count for a in result.actions if isinstance(a, RequestMachines)}
    assert asked == {"g4": 1, "g2": 1}


def test_cpu_and_memory_limits_bind_like_the_gpu_one() -> None:
    p = Policy(cluster=CLUSTER, step_limit=1000, providers={"p": ProviderPolicy(max_ncpus=10, max_mem_mb=20000)})
    w = World([offer("p", "t", ncpus=4, mem=8192)], policy=p)
    result = w.plan(snapshot(1, item("d", 5, ncpus=1)))
    assert sum(a.count for a in result.actions if isinstance(a, RequestMachines)) == 2  # 8 CPUs, 16 GiB
    decision = result.decisions[0]
    assert any("max_ncpus 8/10" in r or "max_mem_mb 16384/20000" in r for rej in decision.filled for r in rej.reasons)


def test_no_limit_no_change() -> None:
    w = gpu_world(policy())
    assert gpus_requested(w.plan(snapshot(1, item("big", 3, gpus=4), item("small", 3, gpus=2))), w) == 24


@settings(max_examples=60, deadline=None)
@given(
    limit=st.integers(0, 40),
    wants=st.lists(st.tuples(st.sampled_from([0, 1, 2, 4]), st.integers(1, 6)), min_size=1, max_size=4),
    in_flight=st.integers(0, 3),
)
def test_the_gpus_asked_never_pass_the_limit(limit: int, wants: list[tuple[int, int]], in_flight: int) -> None:
    w = gpu_world(policy(max_gpus=limit))
    for i in range(in_flight):
        op_id = f"{CLUSTER}:{GPU}:seed:{i}"
        w.commit(RequestIntent(GPU, EPOCH, op_id, "g2", 1, (f"{op_id}/0",), ("h" * 64,), "d"))
    items = [item(f"d{i}", n, gpus=g) for i, (g, n) in enumerate(wants)]
    result = w.plan(snapshot(1, *items))
    already = 2 * in_flight
    asked = gpus_requested(result, w)
    assert already + asked <= max(limit, already)
    # Nothing that would still fit was left unasked for an item that wanted more: its smallest compatible machine
    # (2 GPUs for an item of at most 2, else 4) no longer fits.
    wants_of = {f"d{i}": g for i, (g, _) in enumerate(wants)}
    for decision in result.decisions:
        if decision.unmet > 0:
            smallest = 2 if wants_of[decision.demand_id] <= 2 else 4
            assert already + asked + smallest > limit, (decision.demand_id, already, asked)


def test_the_config_names_the_limits_and_refuses_a_negative_one(tmp_path) -> None:
    providers = """
    [[providers]]
    name = "gpu"
    transport = "oneshot"
    path = "plugins/gpu"
    max_gpus = 8
    max_ncpus = 64
    max_mem_mb = 262144
"""
    own = policy_from_config(parsed_config(tmp_path, providers)).of(GPU)
    assert (own.max_gpus, own.max_ncpus, own.max_mem_mb) == (8, 64, 262144)
    with pytest.raises(ConfigError, match="max_gpus"):
        parsed_config(tmp_path, providers.replace("max_gpus = 8", "max_gpus = -1"))
