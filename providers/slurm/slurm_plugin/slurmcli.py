"""Running the Slurm client commands, and the map from their failures to the contract's error codes.

Every command gets ``commandTimeout`` seconds, the configured ``SLURM_CONF``, and no stdin but what we give it.
A command that fails is mapped by its stderr text (the Slurm client commands have no machine-readable errors; the
texts below are 22.05's, and they have been stable for many releases). First match wins, so the specific texts
come before the general ones. Which message maps to which code, and why:

``throttled`` (retryable: back off and call again):
  - "Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted", "Connection refused",
    "Communication connection failure", "backup controller in standby mode", "Transport endpoint": slurmctld is
    down, restarting, failing over or overloaded. Never "no machines": listing fails rather than return [].
  - "Munge encode failed" / "Munge decode failed" on the *local* side: the node's munged is down.
  - "Resource temporarily unavailable", "temporarily unable to accept job", "Job submission throttled", "Too many
    pending jobs": slurmctld asks us to slow down (MaxJobCount, max_rpc_cnt, submit throttling).
  - the command did not finish within ``commandTimeout`` (the outcome of an sbatch is then unknown: a retry with the
    same op_id first looks for jobs carrying that op's tags, so it never submits twice).
``capacity_unavailable`` (retryable): the partition or nodes exist but cannot take jobs now:
  "Requested partition configuration not available now", "Required node not available", "Requested nodes are busy",
  "Required partition not available (inactive or drain)" (an INACTIVE partition), "Partition in standby".
``invalid_request`` (final; fix the configuration): the request can never run as configured (and a job Slurm
  accepts but leaves pending for a reason no wait fixes, e.g. ``PartitionConfig`` for more CPUs than the whole
  partition has, is cancelled at once and refused the same way: see ``submit._refuse_hopeless``):
  "Requested node configuration is not available" (more CPUs, memory or GRES than any node of the partition has:
  the template is impossible, waiting will not help), "Invalid partition name", "Invalid account", "Invalid qos",
  "Invalid generic resource", "Invalid --time"/"Requested time limit is invalid", "Invalid feature specification",
  "Node count specification invalid", "Memory required by task is not available", "can not be satisfied".
``quota_exceeded`` (final until an administrator changes a limit): "Job violates accounting/QOS policy",
  "AssocMaxSubmitJobLimit", "QOSMaxSubmitJob", "MaxSubmitJobs", "exceeded ... submit limit".
``auth_failed`` (final): "Access/permission denied", "Invalid user id", "User's group not permitted",
  "Protocol authentication error", "Invalid authentication credential", "not authorized".
``provider_error`` (final): anything else, with the first line of stderr.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence

from provisionerd.plugin_sdk.errors import PluginError

_RULES: tuple[tuple[str, str], ...] = (
    ("munge encode failed", "throttled"),
    ("munge decode failed", "throttled"),
    ("unable to contact slurm controller", "throttled"),
    ("socket timed out", "throttled"),
    ("zero bytes were transmitted", "throttled"),
    ("connection refused", "throttled"),
    ("communication connection failure", "throttled"),
    ("backup controller in standby mode", "throttled"),
    ("transport endpoint", "throttled"),
    ("temporarily unable to accept job", "throttled"),
    ("resource temporarily unavailable", "throttled"),
    ("job submission throttled", "throttled"),
    ("too many pending jobs", "throttled"),
    ("requested partition configuration not available now", "capacity_unavailable"),
    ("required partition not available", "capacity_unavailable"),
    ("required node not available", "capacity_unavailable"),
    ("requested nodes are busy", "capacity_unavailable"),
    ("partition is not available", "capacity_unavailable"),
    ("partition in standby", "capacity_unavailable"),
    ("violates accounting/qos policy", "quota_exceeded"),
    ("maxsubmitjob", "quota_exceeded"),
    ("submit limit", "quota_exceeded"),
    ("access/permission denied", "auth_failed"),
    ("permission denied", "auth_failed"),
    ("invalid user id", "auth_failed"),
    ("not permitted to use this partition", "auth_failed"),
    ("protocol authentication error", "auth_failed"),
    ("invalid authentication credential", "auth_failed"),
    ("not authorized", "auth_failed"),
    ("requested node configuration is not available", "invalid_request"),
    ("can not be satisfied", "invalid_request"),
    ("invalid partition", "invalid_request"),
    ("invalid account", "invalid_request"),
    ("invalid qos", "invalid_request"),
    ("invalid generic resource", "invalid_request"),
    ("invalid --time", "invalid_request"),
    ("time limit is invalid", "invalid_request"),
    ("invalid feature", "invalid_request"),
    ("node count specification invalid", "invalid_request"),
    ("memory required by task is not available", "invalid_request"),
    ("invalid job id specified", "invalid_request"),
)

#: Attached to every throttled message of a mutating command, so an operator reading it knows a retry is safe.
UNKNOWN_OUTCOME = "the command may or may not have taken effect; a retry with the same op_id is safe"


def classify(stderr: str) -> str:
    """The contract code for a Slurm command's error text."""
    text = stderr.lower()
    for needle, code in _RULES:
        if needle in text:
            return code
    return "provider_error"


def _summary(stderr: str) -> str:
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    # Slurm prints the generic line last ("Batch job submission failed: ..."), the specific one before it.
    return " / ".join(lines[-2:])[:500] if lines else "no error text"


class SlurmCommands:
    """Runs ``sbatch``/``squeue``/... with one environment and timeout. Thread-safe (no shared state)."""

    def __init__(self, *, timeout: float, slurm_conf: str | None = None, bin_dir: str | None = None) -> None:
        self.timeout = timeout
        self.bin_dir = bin_dir
        env = dict(os.environ)
        if slurm_conf:
            env["SLURM_CONF"] = slurm_conf
        env["SLURM_TIME_FORMAT"] = "%s"  # epoch seconds in squeue/sacct output: no time zone guessing
        for name in list(env):
            if name.startswith(("SBATCH_", "SQUEUE_", "SLURM_")) and name not in ("SLURM_CONF", "SLURM_TIME_FORMAT"):
                del env[name]  # only our options count (SQUEUE_FORMAT, SBATCH_EXPORT, ... would change them)
        self.env = env

    def run(self, tool: str, args: Sequence[str], *, stdin: str | None = None, mutating: bool = False) -> str:
        """stdout of ``tool args``; raises ``PluginError`` with the mapped code when it fails or hangs."""
        exe = os.path.join(self.bin_dir, tool) if self.bin_dir else tool
        try:
            done = subprocess.run(
                [exe, *args],
                input=stdin if stdin is not None else "",
                capture_output=True,
                text=True,
                env=self.env,
                timeout=self.timeout,
                errors="replace",
            )
        except FileNotFoundError:
            raise PluginError("provider_error", f"{tool} is not installed (or not in slurmBinDir/PATH)") from None
        except subprocess.TimeoutExpired:
            note = f"; {UNKNOWN_OUTCOME}" if mutating else ""
            raise PluginError(
                "throttled", f"{tool} did not finish within {self.timeout:g} s (slurmctld slow or unreachable){note}"
            ) from None
        if done.returncode != 0:
            code = classify(done.stderr)
            note = f"; {UNKNOWN_OUTCOME}" if mutating and code == "throttled" else ""
            raise PluginError(code, f"{tool} failed (exit {done.returncode}): {_summary(done.stderr)}{note}")
        return done.stdout
