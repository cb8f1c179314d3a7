"""Reading and changing the Slurm cluster through its client commands: our jobs, accounting, nodes, sbatch, scancel.

"Our jobs" are the submitting user's jobs (``squeue --me``) whose comment carries our tags: a job of another user
is never even read, and a job of ours without the tags is never touched.
"""

from __future__ import annotations

from collections.abc import Iterable

from provisionerd.plugin_sdk.errors import PluginError
from slurm_plugin import jobs as jobmod
from slurm_plugin.config import Config
from slurm_plugin.jobs import JobRecord
from slurm_plugin.slurmcli import SlurmCommands


class SlurmCluster:
    def __init__(self, config: Config, commands: SlurmCommands | None = None) -> None:
        self.config = config
        self.cmd = commands or SlurmCommands(
            timeout=config.command_timeout, slurm_conf=config.slurm_conf, bin_dir=config.slurm_bin_dir
        )

    def my_jobs(self) -> dict[str, JobRecord]:
        """Every job of this user slurmctld still knows (any state), by job id. Raises ``PluginError`` (throttled
        when slurmctld is unreachable): an unreadable queue is never an empty one."""
        out = self.cmd.run("squeue", ["--me", "-h", "-t", "all", "-O", jobmod.SQUEUE_FIELDS])
        return {r.job_id: r for r in jobmod.parse_squeue(out)}

    def owned(self, records: dict[str, JobRecord], wanted: dict[str, str]) -> list[JobRecord]:
        """The records carrying all of ``wanted`` tags (and therefore ours), submission refusals left out."""
        return [
            r
            for r in records.values()
            if r.tags is not None and not r.rejected and all(r.tags.get(k) == v for k, v in wanted.items())
        ]

    def accounting(self, job_ids: Iterable[str]) -> dict[str, JobRecord]:
        """Records of jobs slurmctld has purged (after MinJobAge), from sacct; empty when accounting is off or
        unavailable (the caller then reports those jobs as gone, which is what they are)."""
        ids = sorted({j for j in job_ids if j.isdigit()}, key=int)
        if not ids or self.config.accounting == "none":
            return {}
        args = ["-X", "-n", "-P", "-o", "JobID,State,ExitCode", "-j", ",".join(ids)]
        if self.config.accounting == "jobcomp":
            args.insert(0, "-c")
        try:
            return jobmod.parse_sacct(self.cmd.run("sacct", args))
        except PluginError:
            return {}

    def node_addresses(self) -> dict[str, str]:
        """NodeName -> NodeAddr; empty when sinfo fails (addresses are informational)."""
        try:
            out = self.cmd.run("sinfo", ["-h", "-N", "-o", "%N|%o"])
        except PluginError:
            return {}
        pairs = (line.split("|", 1) for line in out.splitlines() if "|" in line)
        return {name.strip(): addr.strip() for name, addr in pairs}

    def submit(self, args: list[str], script: str) -> str:
        """``sbatch --parsable ARGS`` with the script on stdin; the new job id."""
        out = self.cmd.run("sbatch", ["--parsable", *args], stdin=script, mutating=True).strip()
        job_id = out.split(";", 1)[0]  # --parsable prints "id" or "id;cluster"
        if not job_id.isdigit():
            raise PluginError("provider_error", f"sbatch printed {out[:100]!r}, not a job id")
        return job_id

    def cancel(self, job_id: str, name: str) -> None:
        """``scancel --name NAME ID``: Slurm itself refuses to cancel the job unless it still has that name, so a
        job id that was reused or misread can never take another job down. Cancelling an ended job is fine."""
        try:
            self.cmd.run("scancel", ["--name", name, job_id], mutating=True)
        except PluginError as err:
            if "invalid job id" in err.message.lower() or "already completed" in err.message.lower():
                return
            raise

    def set_comment(self, job_id: str, comment: str) -> bool:
        """Replace a live job's comment; False when the job has already ended (nothing to mark)."""
        try:
            self.cmd.run("scontrol", ["update", f"JobId={job_id}", f"Comment={comment}"], mutating=True)
        except PluginError as err:
            if err.code == "throttled":
                raise
            return False
        return True
