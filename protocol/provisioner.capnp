# provisionerd wire protocol, version 1. The spec around this schema is docs/protocol.md.
#
# A frame on the stream is an 8-byte little-endian unsigned body length followed by the body: one *unpacked*
# Cap'n Proto message in standard serialization (segment table included) whose root is `Frame`.
#
# Compatibility rules (Cap'n Proto's own): fields and union members are only ever added with new ordinals, never
# renumbered or retyped. Every message is a struct (even the empty ones) so that fields can be added later.
# Names here are lowerCamelCase; the Python side uses the same names in snake_case.

@0xb40be66711139fd0;

# --- shared values ---------------------------------------------------------------------------------------------

struct Epoch {
  # A lease epoch: (HA term, grant sequence within the term). Ordered lexicographically.
  term @0 :UInt64;
  seq @1 :UInt64;
}

enum Role {
  controller @0;
  provisioner @1;
  worker @2;
  admin @3;
}

enum HostStatus {
  joined @0;
  idle @1;
  busy @2;
  lost @3;
}

struct KeyValue {
  # One entry of a string map. A map is a List(KeyValue) with unique keys (duplicates are a decode error).
  key @0 :Text;
  value @1 :Text;
}

# Optional values: a null pointer reads as the default, `none`, so an absent field means "no value".
struct OptionalText {
  union {
    none @0 :Void;
    some @1 :Text;
  }
}

struct OptionalFloat64 {
  union {
    none @0 :Void;
    some @1 :Float64;
  }
}

# --- demand ----------------------------------------------------------------------------------------------------

struct ResourceShape {
  ncpus @0 :UInt32;
  memMb @1 :UInt64;
  gpus @2 :UInt32;
  gpuType @3 :OptionalText;
  arch @4 :OptionalText;
  attributes @5 :List(KeyValue);  # extra equality constraints, e.g. zone=a
}

struct DemandItem {
  demandId @0 :Text;
  shape @1 :ResourceShape;
  count @2 :UInt32;
  maxHourlyCost @3 :OptionalFloat64;  # cap on the price per machine-hour; none = no cap
  providers @4 :List(Text);           # empty = any provider this daemon serves
  placement @5 :List(KeyValue);       # placement hints
  reservation @6 :Text;               # the reservation the machines are for ("" = none); kept on their intent
  release @7 :Text;                   # "" = after idleTime; "on_completion" = at once when no item names
                                      # the reservation any more
  costCurrency @8 :Text;              # maxHourlyCost's currency ("" = unchecked); other currencies are refused
  allOrNothing @9 :Bool;              # all count machines or none (an MPI job): one offer, one op, never split
}

struct PriceQuote {
  # A provider's price for one machine of an offer, as the provider gave it; amount 0 and empty currency = none.
  amount @0 :Float64;
  currency @1 :Text;
  unit @2 :Text;                      # "hour"
  source @3 :Text;
  timestamp @4 :Text;                 # RFC 3339
}

# --- facts -----------------------------------------------------------------------------------------------------

struct Fact {
  # Every fact names its provider and carries the lease epoch it was written under; the controller rejects a
  # fact whose epoch is not the provider's current lease epoch. opId is the action's idempotency key.
  provider @0 :Text;
  epoch @1 :Epoch;
  opId @2 :Text;
  union {
    requestIntent @3 :RequestIntent;
    instanceFact @4 :InstanceFact;
    requestFailed @5 :RequestFailed;
    returnIntent @6 :ReturnIntent;
    returned @7 :Returned;
    lost @8 :Lost;
    orphanReported @9 :OrphanReported;
    orphanAdopted @10 :OrphanAdopted;
    drainRequested @11 :DrainRequested;
  }
}

struct RequestIntent {
  templateId @0 :Text;
  count @1 :UInt32;
  instanceRefs @2 :List(Text);
  tokenHashes @3 :List(Text);     # hex SHA-256 of each single-use join token, never the token
  demandId @4 :Text;
  reservation @5 :Text;           # the demand item's reservation and release when planned (see DemandItem)
  release @6 :Text;
  price @7 :PriceQuote;           # the chosen offer's quote when planned; null = unpriced
  allOrNothing @8 :Bool;          # all count machines or none: if the op ends with fewer, they are returned
}

struct InstanceFact {
  instanceRef @0 :Text;
  machineId @1 :Text;
  templateId @2 :Text;
  tokenHash @3 :Text;
  hostname @4 :Text;
  address @5 :Text;
  launchTime @6 :Float64;         # epoch seconds as the provider reported them; 0 = unknown
  price @7 :PriceQuote;           # the quote the machine was chosen at; null = unpriced
  instanceType @8 :Text;          # the instance type it really got (a template may list several); "" = not said
}

struct RequestFailed {
  reason @0 :Text;
}

struct ReturnIntent {
  machineIds @0 :List(Text);
  reason @1 :Text;
}

struct Returned {
  machineIds @0 :List(Text);
  at @1 :Float64;                 # epoch seconds when the return was confirmed; 0 = unknown (informational)
}

struct Lost {
  machineId @0 :Text;
  reason @1 :Text;
}

struct OrphanReported {
  machineId @0 :Text;
  orphanClass @1 :Text;           # never_joined | tagged_unknown | ghost | license
  evidence @2 :Text;              # JSON text
}

struct OrphanAdopted {
  machineId @0 :Text;
  instanceRef @1 :Text;
  hostname @2 :Text;
  address @3 :Text;
}

struct DrainRequested {
  # The daemon asks the controller to place no new work on these machines (past maxTtl, docs/operations.md);
  # it returns each when idle, or at `at` + its drain_timeout, busy or not. Live while a machine it names is.
  # Sent only to a controller whose JoinReply said `drains`.
  machineIds @0 :List(Text);
  reason @1 :Text;                # "max_ttl"
  at @2 :Float64;                 # epoch seconds when the drain was asked: the drain timeout counts from here
}

struct CommittedFact {
  index @0 :UInt64;               # position in the controller's log, strictly increasing
  fact @1 :Fact;
  committedAt @2 :Float64;        # epoch seconds (wall clock) when the controller committed the fact; 0 = not known
                                  # (an older controller, or a fact committed before the field existed)
}

struct HostState {
  instanceRef @0 :Text;
  provider @1 :Text;
  machineId @2 :Text;
  status @3 :HostStatus;
  since @4 :Float64;              # epoch seconds
  hostname @5 :Text;
  address @6 :Text;
  draining @7 :Bool;              # a DrainRequested fact names this host's machine: the controller places no
                                  # new work on it (false from older controllers)
  capabilities @8 :List(KeyValue);  # what the worker reported at its join (Join.capabilities), bounded by the
                                    # controller; empty = nothing reported (older workers): nothing to verify
  reclaimAt @9 :Float64;          # the provider takes the machine back at this time (epoch seconds; a spot
                                  # interruption notice, WorkerStatus.reclaimAt); 0 = no notice (older peers)
  rebalanceAt @10 :Float64;       # the provider recommended, at this time (epoch seconds), moving off the machine
                                  # (an EC2 rebalance recommendation); 0 = none (older peers)
  probedAt @11 :Float64;          # capabilities came from a re-probe after the join, made at this time (epoch
                                  # seconds, WorkerStatus.probedAt); 0 = the join's own report (older controllers)
}

# --- session ---------------------------------------------------------------------------------------------------

struct Join {
  role @0 :Role;
  identity @1 :Text;
  protocolVersion @2 :UInt32;
  providers @3 :List(Text);
  instanceRef @4 :Text;           # worker only
  token @5 :Text;                 # worker only: the single-use join token (a secret: never log it)
  instance @6 :Text;              # provisioner only: random per process start, at most 64 chars, never reused;
                                  # the lease holder is identity + instance ("" from older clients: identity only)
  machineId @7 :Text;             # worker only, the opt-in address-bound join (§4): the provider's machine id this
                                  # worker claims to be, with instanceRef "" and token "bootstrap-v1:<secret>"
  capabilities @8 :List(KeyValue);  # worker only: what the machine has, as offer attribute names (ncpus, mem in
                                    # MiB, type, and each probe its template declares, e.g. ngpus); at most 8
                                    # entries, keys <= 32 and values <= 64 characters (§4 "Capabilities")
}

struct JoinReply {
  accepted @0 :Bool;
  term @1 :UInt64;
  primary @2 :Bool;
  redirect @3 :Text;              # "host:port" of the primary when a standby refuses
  controllerId @4 :Text;
  protocolVersion @5 :UInt32;
  reason @6 :Text;
  incarnation @7 :Text;           # accepted replies: the id of the controller's fact log, made when the log was
                                  # created and never again ("" from older controllers: unknown, see §4)
  lastIndex @8 :UInt64;           # accepted replies: the highest fact index the log ever committed (0: empty)
  credential @9 :Text;            # accepted worker replies: the instance's own credential, issued when its token
                                  # was spent (a secret: never log it); the worker presents it in Join.token on
                                  # every later join. "" when the join already presented it (§4 "Worker credential")
  instanceRef @10 :Text;          # accepted address-bound joins: the instance the claimed machine was paired with
  drains @11 :Bool;               # accepted replies: this controller knows Fact.drainRequested and HostState.draining
                                  # (false from older controllers: a provisioner sends them no drainRequested)
  history @12 :Bool;              # accepted replies: this controller answers historyQuery (§6.6; false from older
                                  # controllers: a provisioner sends them no historyQuery)
}

struct Heartbeat {
  seq @0 :UInt64;
}

struct HeartbeatAck {
  seq @0 :UInt64;
  term @1 :UInt64;
  # The digest (§6.3 "Incremental resync"; 0 from older controllers: no digest). For the connection's providers:
  lastIndex @2 :UInt64;           # the highest fact index of those providers
  demandSeq @3 :UInt64;           # the current demand snapshot's seq
  hostSeq @4 :UInt64;             # host-state changes pushed to this connection so far (hostStatePush.seq)
}

enum ErrorCode {
  versionMismatch @0;
  notAllowed @1;
  badFrame @2;
  notJoined @3;
  tokenInvalid @4;
  internal @5;
}

struct ErrorMsg {
  code @0 :ErrorCode;
  message @1 :Text;
}

enum RejectReason {
  staleEpoch @0;
  noQuorum @1;
  notPrimary @2;
  noLease @3;
  invalid @4;
  tokenInvalid @5;
  storageFailure @6;  # the controller could not make the write durable (disk full, I/O error); link kept
}

struct Rejected {
  reason @0 :RejectReason;
  detail @1 :Text;
}

struct Ack {}

# --- leases ----------------------------------------------------------------------------------------------------

struct LeaseAcquire {
  provider @0 :Text;
}

struct LeaseRenew {
  provider @0 :Text;
  epoch @1 :Epoch;
}

struct LeaseRelease {
  provider @0 :Text;
  epoch @1 :Epoch;
}

struct LeaseGrant {
  provider @0 :Text;
  epoch @1 :Epoch;
  ttlMs @2 :UInt64;
}

enum DenyReason {
  held @0;
  grace @1;
  noQuorum @2;
  notPrimary @3;
  staleEpoch @4;
  noLease @5;
}

struct LeaseDenied {
  provider @0 :Text;
  reason @1 :DenyReason;
  retryAfterMs @2 :UInt64;
}

# ctl -> provisioner push (corr 0): the provider's lease ended (released, or expired unrenewed) and this connection
# was denied it as `held` meanwhile. A hint, never a grant: the provisioner may acquire at once instead of waiting
# out `retryAfterMs`; the primary's rules (grace, quorum) still decide.
struct LeaseFreed {
  provider @0 :Text;
}

# --- demand, facts, hosts --------------------------------------------------------------------------------------

# The controller's count of licence units in use by jobs, per provider and pool (orphan class license).
struct LicenseUse {
  provider @0 :Text;
  pool @1 :Text;
  inUse @2 :UInt32;
}

struct DemandPage {
  snapshotSeq @0 :UInt64;
  page @1 :UInt32;                # 0-based
  pageCount @2 :UInt32;           # >= 1
  items @3 :List(DemandItem);
  licenses @4 :List(LicenseUse);  # page 0 only (empty on the others and from older controllers): the controller's
                                  # licence use as of this snapshot; a pool not named is one it does not count
}

struct FactCommit {
  fact @0 :Fact;
}

struct FactAck {
  index @0 :UInt64;
  committedAt @1 :Float64;        # the acknowledged fact's CommittedFact.committedAt (0 = not known: an older
                                  # controller); a retried commit is answered with the first commit's time
}

struct ResyncRequest {
  providers @0 :List(Text);
  afterIndex @1 :UInt64;          # 0: a full resync; else the provisioner holds every fact of these providers up
                                  # to this index of incarnation `incarnation` and asks only for later ones
  incarnation @2 :Text;           # the JoinReply.incarnation those facts came from (with afterIndex)
}

struct ResyncPage {
  page @0 :UInt32;                # 0-based
  pageCount @1 :UInt32;           # >= 1
  facts @2 :List(CommittedFact);  # in log order across all pages
  hosts @3 :List(HostState);
  incremental @4 :Bool;           # true: the facts after the request's afterIndex (fold them into what you hold);
                                  # false: the whole resync set (replace what you hold)
  asOf @5 :UInt64;                # the log index the resync was fixed at (0 from older controllers)
  hostSeq @6 :UInt64;             # the connection's host-state seq the hosts are as of
}

struct HostStatePush {
  hosts @0 :List(HostState);
  seq @1 :UInt64;                 # this connection's host-state seq after these changes (0 from older controllers)
}

struct WorkerStatus {
  status @0 :HostStatus;
  reclaimAt @1 :Float64;          # the machine's reclaim notice (HostState.reclaimAt); 0 = none (older workers)
  rebalanceAt @2 :Float64;        # its rebalance recommendation (HostState.rebalanceAt); 0 = none
  capabilities @3 :List(KeyValue);  # the latest re-probe's report, whole (bounds as Join.capabilities); empty =
                                    # unchanged since the last one sent (older workers send none)
  probedAt @4 :Float64;           # when that re-probe ran (epoch seconds); 0 = none
}

# --- admin -----------------------------------------------------------------------------------------------------

struct AdminSetDemand {
  items @0 :List(DemandItem);
  licenses @1 :List(LicenseUse);  # the licence use the demand snapshot carries (DemandPage.licenses)
}

struct AdminFailover {
  target @0 :Int32;               # replica index; -1 = the next replica
}

struct AdminQuorum {
  fresh @0 :Bool;
}

struct AdminStatus {}

struct AdminReply {
  ok @0 :Bool;
  json @1 :Text;
}

# --- history (§6.6) --------------------------------------------------------------------------------------------

# A page of the fact log, ended lifecycles included (the resync set holds live ones only). Sent by an admin (any
# providers) or a provisioner (only providers its Join declared); a worker may not. The cursor is a fact index.
struct HistoryQuery {
  providers @0 :List(Text);       # empty: every provider the sender may read (admin: all; provisioner: its Join's)
  afterIndex @1 :UInt64;          # the cursor: facts with a higher index (0: from the start)
  untilIndex @2 :UInt64;          # facts up to this index (0: the log's last index as of this query)
  maxFacts @3 :UInt32;            # at most this many (0 or more than the controller's page: its page, 500)
}

struct HistoryPage {
  facts @0 :List(CommittedFact);  # in log order, bounded in count and in encoded bytes like a resync page
  nextAfter @1 :UInt64;           # the cursor for the next query (afterIndex): the last index this page covers
  untilIndex @2 :UInt64;          # the upper bound this page used: send it back to page one fixed log
  done @3 :Bool;                  # true: no fact of the query above nextAfter up to untilIndex
}

# --- the root --------------------------------------------------------------------------------------------------

struct Frame {
  corr @0 :UInt64;                # chosen by the requester, echoed in the reply; 0 for pushes
  body :union {
    join @1 :Join;
    joinReply @2 :JoinReply;
    heartbeat @3 :Heartbeat;
    heartbeatAck @4 :HeartbeatAck;
    errorMsg @5 :ErrorMsg;
    rejected @6 :Rejected;
    ack @7 :Ack;
    leaseAcquire @8 :LeaseAcquire;
    leaseRenew @9 :LeaseRenew;
    leaseRelease @10 :LeaseRelease;
    leaseGrant @11 :LeaseGrant;
    leaseDenied @12 :LeaseDenied;
    demandPage @13 :DemandPage;
    factCommit @14 :FactCommit;
    factAck @15 :FactAck;
    resyncRequest @16 :ResyncRequest;
    resyncPage @17 :ResyncPage;
    hostStatePush @18 :HostStatePush;
    workerStatus @19 :WorkerStatus;
    adminSetDemand @20 :AdminSetDemand;
    adminFailover @21 :AdminFailover;
    adminQuorum @22 :AdminQuorum;
    adminStatus @23 :AdminStatus;
    adminReply @24 :AdminReply;
    leaseFreed @25 :LeaseFreed;
    historyQuery @26 :HistoryQuery;
    historyPage @27 :HistoryPage;
  }
}
