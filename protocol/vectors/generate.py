"""Golden frames: one file per message kind (``<kind>.json``; ``factCommit`` once per fact kind), written from the
values below with the project's codec and ``capnp decode`` (the C++ tool, Debian's ``capnproto``).

    python protocol/vectors/generate.py            # rewrite the files (needs the capnp tool)
    python protocol/vectors/generate.py --check    # exit 1 if a file differs from what would be written

Each file holds ``kind`` (the ``Frame.body`` union member), ``corr``, ``body_hex`` (the frame body: an unpacked
Cap'n Proto message, standard serialization, without the 8-byte length header of docs/protocol.md §2),
``frame_hex`` (the same with its header, as it goes on the wire) and ``text`` (what ``capnp decode --short
protocol/provisioner.capnp Frame`` prints for the body). An implementer in C or Go decodes ``body_hex`` with their
reader and compares it with ``text``, and encodes ``text`` (``capnp encode``) and decodes it with their reader.
``tests/wire/test_vectors.py`` checks both directions with our codec and with the capnp tool.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path

import attrs

from provisionerd.domain.model import (
    CommittedFact,
    DemandItem,
    DrainRequested,
    Epoch,
    HostState,
    HostStatus,
    InstanceFact,
    Lost,
    OrphanAdopted,
    OrphanReported,
    RequestFailed,
    RequestIntent,
    ResourceShape,
    Returned,
    ReturnIntent,
    Role,
)
from provisionerd.wire import codec
from provisionerd.wire import messages as m
from provisionerd.wire.framing import frame_bytes

HERE = Path(__file__).resolve().parent
E = Epoch(3, 7)
HASH = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"  # sha256("test")
ITEM = DemandItem(
    "gpu-jobs",
    ResourceShape(ncpus=8, mem_mb=32768, gpus=1, gpu_type="a100", arch=None, attributes={"zone": "a"}),
    4,
    max_hourly_cost=2.5,
    providers=("aws",),
    placement={"rack": "r1", "room": "2"},
    all_or_nothing=True,
)
HOST = HostState("i-1", "aws", "m-1", HostStatus.BUSY, 1700000000.5, "node-1", "10.0.0.1")
FACTS = {
    "requestIntent": RequestIntent(
        "aws", E, "op-1", "t.large", 2, ("i-1", "i-2"), (HASH, HASH), "gpu-jobs", all_or_nothing=True
    ),
    "instanceFact": InstanceFact(
        "aws", E, "op-1", "i-1", "m-1", "t.large", HASH, "node-1", "10.0.0.1", 1700000000.25, instance_type="m5.large"
    ),
    "requestFailed": RequestFailed("aws", E, "op-2", "capacity_unavailable"),
    "returnIntent": ReturnIntent("aws", E, "op-3", ("m-1",), "idle"),
    "returned": Returned("aws", E, "op-3", ("m-1",)),
    "lost": Lost("aws", E, "op-4", "m-2", "vanished"),
    "orphanReported": OrphanReported("aws", E, "op-5", "m-3", "tagged_unknown", '{"age_s": 900}'),
    "orphanAdopted": OrphanAdopted("aws", E, "op-6", "m-3", "i-3", "node-3", "10.0.0.3"),
    "drainRequested": DrainRequested("aws", E, "op-7", ("m-1",), "max_ttl", 1700003600.5),
}

#: file stem -> (corr, message). One per Frame.body member; factCommit once per fact kind.
VECTORS: dict[str, tuple[int, m.Message]] = {
    "join": (1, m.Join(Role.PROVISIONER, "prov-a", 1, ("aws", "slurm"), "", "", "0123456789abcdef")),
    "join.worker": (1, m.Join(Role.WORKER, "w-1", 1, (), "i-1", "tok-not-a-real-secret")),
    "joinReply": (1, m.JoinReply(True, 3, True, "", "replica-0", 1, "", "5f0c" * 8, 42)),
    "joinReply.redirect": (1, m.JoinReply(False, 3, False, "10.0.0.9:7400", "replica-1", 1, "not_primary")),
    "heartbeat": (2, m.Heartbeat(1)),
    "heartbeatAck": (2, m.HeartbeatAck(1, 3, 42, 5, 9)),
    "errorMsg": (7, m.ErrorMsg("not_allowed", "role worker may not send leaseAcquire")),
    "rejected": (8, m.Rejected("stale_epoch", "epoch 3.6 is not the current 3.7")),
    "ack": (9, m.Ack()),
    "leaseAcquire": (10, m.LeaseAcquire("aws")),
    "leaseRenew": (11, m.LeaseRenew("aws", E)),
    "leaseRelease": (12, m.LeaseRelease("aws", E)),
    "leaseGrant": (10, m.LeaseGrant("aws", E, 30000)),
    "leaseDenied": (10, m.LeaseDenied("aws", "grace", 34500)),
    "leaseFreed": (0, m.LeaseFreed("aws")),
    "demandPage": (0, m.DemandPage(5, 0, 2, (ITEM, DemandItem("cpu", ResourceShape(), 0)))),
    **{f"factCommit.{kind}": (20 + i, m.FactCommit(fact)) for i, (kind, fact) in enumerate(FACTS.items())},
    "factAck": (20, m.FactAck(43, 1700000002.25)),
    "resyncRequest": (30, m.ResyncRequest(("aws",), 40, "5f0c" * 8)),
    "resyncPage": (
        30,
        m.ResyncPage(
            0,
            1,
            # committed at a known time, and one whose time is not known (0: committed before the field existed)
            (CommittedFact(41, FACTS["requestIntent"], 1700000001.5), CommittedFact(42, FACTS["instanceFact"])),
            (HOST,),
            True,
            42,
            9,
        ),
    ),
    "hostStatePush": (0, m.HostStatePush((HOST,), 10)),
    "workerStatus": (3, m.WorkerStatus(HostStatus.IDLE)),
    # A spot interruption notice two minutes after a rebalance recommendation (protocol §6.4 "Reclaim notices").
    "workerStatus.reclaim": (4, m.WorkerStatus(HostStatus.BUSY, 1700000120.0, 1700000000.0)),
    "hostStatePush.reclaim": (
        0,
        m.HostStatePush((attrs.evolve(HOST, reclaim_at=1700000120.0, rebalance_at=1700000000.0),), 11),
    ),
    # A re-probe after the join that found the GPU gone (protocol §6.4 "Health after join").
    "workerStatus.reprobe": (
        5,
        m.WorkerStatus(HostStatus.BUSY, capabilities={"ngpus": "!exit 9", "ncpus": "4"}, probed_at=1700000300.0),
    ),
    "hostStatePush.reprobe": (
        0,
        m.HostStatePush((attrs.evolve(HOST, capabilities={"ngpus": "!exit 9"}, probed_at=1700000300.0),), 12),
    ),
    "adminSetDemand": (4, m.AdminSetDemand((ITEM,))),
    "adminFailover": (5, m.AdminFailover(-1)),
    "adminQuorum": (6, m.AdminQuorum(False)),
    "adminStatus": (7, m.AdminStatus()),
    "adminReply": (7, m.AdminReply(True, '{"primary": 1, "term": 4}')),
    "historyQuery": (40, m.HistoryQuery(("aws",), 41, 42, 500)),
    "historyPage": (
        40,
        m.HistoryPage((CommittedFact(42, FACTS["returned"], 1700000003.75),), 42, 42, True),
    ),
}


def capnp_text(body: bytes) -> str:
    tool = shutil.which("capnp")
    if tool is None:
        raise SystemExit("generate.py needs the capnp tool (Debian: apt-get install capnproto)")
    done = subprocess.run(
        [tool, "decode", "--short", str(codec.SCHEMA_PATH), "Frame"], input=body, capture_output=True, check=True
    )
    return done.stdout.decode().strip()


def document(stem: str) -> dict[str, object]:
    corr, msg = VECTORS[stem]
    body = codec.encode(msg, corr)
    return {
        "kind": codec.opcode(msg),
        "corr": corr,
        "body_hex": body.hex(),
        "frame_hex": frame_bytes(body).hex(),
        "text": capnp_text(body),
    }


def rendered(stem: str) -> str:
    return json.dumps(document(stem), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for stem in VECTORS:
        path, text = HERE / f"{stem}.json", rendered(stem)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print("out of date (run protocol/vectors/generate.py): " + ", ".join(stale), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
