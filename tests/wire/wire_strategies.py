"""Hypothesis strategies for every wire message and every value it embeds."""

from __future__ import annotations

from hypothesis import strategies as st

from provisionerd.domain import model
from provisionerd.wire import messages as m

text = st.text(max_size=12)  # includes NUL and any non-surrogate code point
u32 = st.integers(0, 2**32 - 1)
u64 = st.integers(0, 2**64 - 1)
floats = st.floats(allow_nan=False)
texts = st.lists(text, max_size=3).map(tuple)
str_map = st.dictionaries(text, text, max_size=3)

epochs = st.builds(model.Epoch, u64, u64)
shapes = st.builds(
    model.ResourceShape,
    ncpus=u32,
    mem_mb=u64,
    gpus=u32,
    gpu_type=st.none() | text,
    arch=st.none() | text,
    attributes=str_map,
)
demand_items = st.builds(
    model.DemandItem,
    demand_id=text,
    shape=shapes,
    count=u32,
    max_hourly_cost=st.none() | floats,
    providers=texts,
    placement=str_map,
)
_head = {"provider": text, "epoch": epochs, "op_id": text}
FACT_STRATEGIES = {
    model.RequestIntent: st.builds(
        model.RequestIntent,
        **_head,
        template_id=text,
        count=u32,
        instance_refs=texts,
        token_hashes=texts,
        demand_id=text,
    ),
    model.InstanceFact: st.builds(
        model.InstanceFact,
        **_head,
        instance_ref=text,
        machine_id=text,
        template_id=text,
        token_hash=text,
        hostname=text,
        address=text,
        launch_time=floats,
    ),
    model.RequestFailed: st.builds(model.RequestFailed, **_head, reason=text),
    model.ReturnIntent: st.builds(model.ReturnIntent, **_head, machine_ids=texts, reason=text),
    model.Returned: st.builds(model.Returned, **_head, machine_ids=texts),
    model.Lost: st.builds(model.Lost, **_head, machine_id=text, reason=text),
    model.OrphanReported: st.builds(model.OrphanReported, **_head, machine_id=text, orphan_class=text, evidence=text),
    model.OrphanAdopted: st.builds(
        model.OrphanAdopted, **_head, machine_id=text, instance_ref=text, hostname=text, address=text
    ),
    model.DrainRequested: st.builds(model.DrainRequested, **_head, machine_ids=texts, reason=text, at=floats),
}
facts = st.one_of(*FACT_STRATEGIES.values())
committed = st.builds(model.CommittedFact, u64, facts, floats)
hosts = st.builds(
    model.HostState,
    instance_ref=text,
    provider=text,
    machine_id=text,
    status=st.sampled_from(model.HostStatus),
    since=floats,
    hostname=text,
    address=text,
    draining=st.booleans(),
    capabilities=str_map,
    reclaim_at=floats,
    rebalance_at=floats,
    probed_at=floats,
)


def _small(strategy):
    return st.lists(strategy, max_size=3)


MESSAGE_STRATEGIES = {
    m.Join: st.builds(
        m.Join,
        role=st.sampled_from(model.Role),
        identity=text,
        protocol_version=u32,
        providers=texts,
        instance_ref=text,
        token=text,
        instance=text,
    ),
    m.JoinReply: st.builds(
        m.JoinReply,
        accepted=st.booleans(),
        term=u64,
        primary=st.booleans(),
        redirect=text,
        controller_id=text,
        protocol_version=u32,
        reason=text,
    ),
    m.Heartbeat: st.builds(m.Heartbeat, u64),
    m.HeartbeatAck: st.builds(m.HeartbeatAck, u64, u64, u64, u64, u64),
    m.ErrorMsg: st.builds(m.ErrorMsg, st.sampled_from(m.ERROR_CODES), text),
    m.Rejected: st.builds(m.Rejected, st.sampled_from(m.REJECT_REASONS), text),
    m.Ack: st.just(m.Ack()),
    m.LeaseAcquire: st.builds(m.LeaseAcquire, text),
    m.LeaseRenew: st.builds(m.LeaseRenew, text, epochs),
    m.LeaseRelease: st.builds(m.LeaseRelease, text, epochs),
    m.LeaseGrant: st.builds(m.LeaseGrant, text, epochs, u64),
    m.LeaseDenied: st.builds(m.LeaseDenied, text, st.sampled_from(m.DENY_REASONS), u64),
    m.DemandPage: st.builds(m.DemandPage, u64, u32, u32, _small(demand_items)),
    m.FactCommit: st.builds(m.FactCommit, facts),
    m.FactAck: st.builds(m.FactAck, u64, floats),
    m.ResyncRequest: st.builds(m.ResyncRequest, texts, u64, text),
    m.ResyncPage: st.builds(m.ResyncPage, u32, u32, _small(committed), _small(hosts), st.booleans(), u64, u64),
    m.HostStatePush: st.builds(m.HostStatePush, _small(hosts), u64),
    m.WorkerStatus: st.builds(m.WorkerStatus, st.sampled_from(model.HostStatus), floats, floats, str_map, floats),
    m.AdminSetDemand: st.builds(m.AdminSetDemand, _small(demand_items)),
    m.AdminFailover: st.builds(m.AdminFailover, st.integers(-(2**31), 2**31 - 1)),
    m.AdminQuorum: st.builds(m.AdminQuorum, st.booleans()),
    m.AdminStatus: st.just(m.AdminStatus()),
    m.AdminReply: st.builds(m.AdminReply, st.booleans(), text),
    m.LeaseFreed: st.builds(m.LeaseFreed, text),
    m.HistoryQuery: st.builds(m.HistoryQuery, texts, u64, u64, u32),
    m.HistoryPage: st.builds(m.HistoryPage, _small(committed), u64, u64, st.booleans()),
}
messages = st.one_of(*MESSAGE_STRATEGIES.values())
