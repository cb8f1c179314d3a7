"""Slurm job records (parsed from ``squeue``/``sacct`` text) and what a job's state means for the contract.

Pure: no I/O. ``SQUEUE_FIELDS`` is the ``squeue -O`` format this module parses; the comment comes last because it
is the one free-text field, so a ``|`` inside another user's comment cannot shift our columns.
"""

from __future__ import annotations

import attrs

from slurm_plugin import tags as tagmod

#: ``squeue --me -h -t all -O <this>`` (22.05). ``Field:|`` means "no padding, then a |". Times are epoch seconds
#: because the command runs with ``SLURM_TIME_FORMAT=%s``; Exit_Code is the raw wait status (768 = exit code 3).
SQUEUE_FIELDS = "JobID:|,State:|,Reason:|,Exit_Code:|,SubmitTime:|,StartTime:|,TimeLeft:|,NodeList:|,Comment:|"
_N_FIELDS = 9

#: States of a job that has not started yet: its machine is still being made (queue delay).
STARTING = frozenset({"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD"})
#: States of a job whose pilot runs (or is paused): the machine exists.
UP = frozenset({"RUNNING", "SUSPENDED", "STOPPED", "RESIZING", "SIGNALING"})
#: The job is ending: processes may still run on the node, so it is still listed, but its machine is over.
ENDING = frozenset({"COMPLETING", "STAGE_OUT"})
ENDED = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)
#: Pending reasons that no amount of waiting fixes: the partition's configuration or the job's own account, QOS or
#: constraints rule it out (an administrator has to change something first).
HOPELESS_REASONS = frozenset(
    {
        "PartitionConfig",
        "BadConstraints",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "InvalidAccount",
        "InvalidQOS",
        "AccountNotAllowed",
        "QOSNotAllowed",
    }
)
#: Why a job that ended without being returned by us ended, in the words the messages and reclaim reasons use.
END_REASONS = {
    "CANCELLED": "cancelled outside provisionerd",
    "FAILED": "the pilot job failed",
    "NODE_FAIL": "the node running the pilot job failed",
    "TIMEOUT": "the pilot job reached its time limit",
    "PREEMPTED": "the pilot job was preempted",
    "BOOT_FAIL": "the node could not boot for the pilot job",
    "DEADLINE": "the pilot job reached its deadline",
    "OUT_OF_MEMORY": "the pilot job ran out of memory",
    "COMPLETED": "the pilot job ended on its own",
    "COMPLETING": "the pilot job is ending on its own",
}


@attrs.frozen
class JobRecord:
    """One job as Slurm reports it. ``tags`` is None when the comment is not one of ours."""

    job_id: str
    state: str
    reason: str = ""
    exit_code: int | None = None
    signal: int | None = None
    submit_time: int | None = None
    start_time: int | None = None
    time_left: int | None = None  # seconds; None = unlimited or unknown
    nodes: str = ""
    tags: dict[str, str] | None = None
    source: str = "squeue"

    @property
    def live(self) -> bool:
        """Still occupying (or waiting for) resources: listed by ``listMachines``. Unknown states count as live,
        so a state added by a later Slurm never hides a job."""
        return self.state not in ENDED

    @property
    def rejected(self) -> bool:
        """A record slurmctld keeps for a submission it refused (``sbatch`` failed): it never was a machine."""
        return self.state == "FAILED" and self.reason == "BadConstraints"

    @property
    def returned(self) -> bool:
        return bool(self.tags) and tagmod.RETURNED in self.tags  # type: ignore[operator]


def _epoch(text: str) -> int | None:
    return int(text) if text.isdigit() and int(text) > 0 else None


def parse_duration(text: str) -> int | None:
    """Seconds in a Slurm duration (``[days-]hours:minutes:seconds``, ``minutes:seconds``); None when unlimited,
    unknown or malformed."""
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    parts = rest.split(":")
    if not days.isdigit() or not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    values = [0] * (3 - len(parts)) + [int(p) for p in parts]
    return int(days) * 86400 + values[0] * 3600 + values[1] * 60 + values[2]


def parse_squeue(text: str) -> list[JobRecord]:
    """Records from ``squeue -h -O SQUEUE_FIELDS`` output. Lines that do not parse are skipped: they can only come
    from a newline inside another job's comment, and a job we cannot read is a job we do not touch."""
    records = []
    for line in text.splitlines():
        fields = line.split("|", _N_FIELDS - 1)
        if len(fields) != _N_FIELDS or not fields[0].isdigit():
            continue
        job_id, state, reason, status, submit, start, left, nodes, comment = fields
        comment = comment[:-1] if comment.endswith("|") else comment
        code = sig = None
        if status.isdigit():
            raw = int(status)
            code, sig = (raw >> 8) & 0xFF, raw & 0x7F
        records.append(
            JobRecord(
                job_id=job_id,
                state=state.split(" ")[0].upper(),
                reason=reason,
                exit_code=code,
                signal=sig,
                submit_time=_epoch(submit),
                start_time=_epoch(start),
                time_left=parse_duration(left),
                nodes="" if nodes in ("", "(null)") else nodes,
                tags=tagmod.decode(comment),
            )
        )
    return records


def parse_sacct(text: str) -> dict[str, JobRecord]:
    """Records from ``sacct -X -n -P -o JobID,State,ExitCode`` (``CANCELLED by 0`` keeps its first word)."""
    found = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) < 3 or not fields[0].isdigit():
            continue
        code, _, sig = fields[2].partition(":")
        found[fields[0]] = JobRecord(
            job_id=fields[0],
            state=fields[1].split(" ")[0].upper(),
            exit_code=int(code) if code.isdigit() else None,
            signal=int(sig) if sig.isdigit() else None,
            source="accounting",
        )
    return found


@attrs.frozen
class Outcome:
    """What one machine's job means for ``getRequestStatus``: ``result`` (executing|succeed|fail), ``status``,
    and a message that types the failure (its first word: ``failed``, ``cancelled``, ``node_fail``, ...)."""

    result: str
    status: str
    message: str


def end_state(record: JobRecord) -> str:
    """The state a job that is over ends in. An ending job (COMPLETING, STAGE_OUT) already carries its pilot's exit
    status: a nonzero exit or a signal ends it FAILED, so a status read in that window types it the same as one
    read a moment later."""
    if record.state in ENDING and (record.signal or record.exit_code):
        return "FAILED"
    return record.state


def _ending(record: JobRecord) -> str:
    state = end_state(record)
    what = END_REASONS.get(state, f"the pilot job ended ({state})")
    detail = ""
    if record.signal:
        detail = f", killed by signal {record.signal}"
    elif record.exit_code is not None and (record.exit_code or state in ("FAILED", "COMPLETED")):
        detail = f", exit code {record.exit_code}"
    return f"{state.lower()}: job {record.job_id}: {what}{detail}"


def outcome(job_id: str, record: JobRecord | None, returned: bool) -> Outcome:
    """The contract's view of a creation request's machine. ``returned``: we cancelled it (our marker)."""
    if record is None:
        if returned:
            return Outcome("succeed", "terminated", f"job {job_id} was returned and is gone from Slurm")
        return Outcome("fail", "unknown", f"gone: job {job_id} is known neither to slurmctld nor to accounting")
    returned = returned or record.returned
    if record.state in STARTING:
        why = f" ({record.reason})" if record.reason and record.reason != "None" else ""
        return Outcome("executing", "pending", f"job {record.job_id} is queued in Slurm{why}")
    if record.state in UP:
        where = f" on {record.nodes}" if record.nodes else ""
        return Outcome("succeed", record.state.lower(), f"job {record.job_id} is {record.state.lower()}{where}")
    if record.state in ENDING or record.state in ENDED:
        if returned:
            return Outcome("succeed", "terminated", f"job {record.job_id} was returned ({record.state})")
        return Outcome("fail", "terminated", _ending(record))
    return Outcome("executing", record.state.lower(), f"job {record.job_id} is in Slurm state {record.state}")


def reclaim_reason(record: JobRecord | None, returned: bool, notice: int) -> tuple[str, int] | None:
    """``(reason, grace seconds)`` when Slurm took (or is about to take) a machine we did not return."""
    if returned or (record is not None and record.returned):
        return None
    if record is None:
        return "gone", 0
    if record.state in ENDED or record.state in ENDING:
        return end_state(record).lower(), 0
    if record.state in UP and record.time_left is not None and record.time_left <= notice:
        return "time_limit", record.time_left
    return None
