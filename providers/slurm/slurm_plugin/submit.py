"""``requestMachines``: one pilot job per machine, submitted at most once per (op_id, instanceRef).

The pilot job runs the worker agent. Its join token goes into a 0600 file in ``<workdir>/tokens/`` (a 0700
directory) that the agent reads and deletes; the job script only names that file. The token is never on a command
line (ours or the agent's), in the job name, the comment, the script, or the job's environment (``--export=NONE``
by default: the job inherits nothing from the plugin either).

Idempotency: before submitting, the plugin lists this user's jobs and takes, for each instanceRef, a job already
carrying the same cluster, op and instance tags (whatever its state: a job that already ran and ended is still that
machine). Only the missing ones are submitted. So the same op_id twice gives the same jobs, and a retry after an
unknown outcome (an sbatch that timed out) finds what the first attempt made.
"""

from __future__ import annotations

import math
import os
import shlex
import stat
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from provisionerd.plugin_sdk.errors import PluginError
from provisionerd.plugin_sdk.ids import make_request_id
from provisionerd.plugin_sdk.ids import parse_request_id as parse_id
from provisionerd.plugin_sdk.inputs import asked_template
from slurm_plugin import tags as tagmod
from slurm_plugin.cluster import SlurmCluster
from slurm_plugin.config import Config, Template
from slurm_plugin.jobs import HOPELESS_REASONS, STARTING, JobRecord
from slurm_plugin.store import Store


def request_id_for(kind: str, cluster: str, op_id: str) -> str:
    """``slurm-req@<cluster hash>@<op_id>`` (``plugin_sdk.ids``)."""
    return make_request_id("slurm", kind, tagmod.cluster_hash(cluster), op_id)


def parse_request_id(request_id: str) -> tuple[str, str, str] | None:
    """``(kind, cluster hash, op_id)`` or None for an id this plugin did not make."""
    return parse_id("slurm", request_id)


def _private_dir(path: Path) -> Path:
    """``path`` as a 0700 directory owned by us (created if missing); refuses one another user owns."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
        raise PluginError("provider_error", f"{str(path)!r} is not a directory owned by this user")
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


def write_token(path: Path, token: str) -> None:
    """Create ``path`` as a fresh 0600 file holding ``token`` (an old file of that name is replaced)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token)


def remove_token(config: Config, machine_tags: Mapping[str, str]) -> None:
    """Delete the token file of a machine whose agent never read it (the job ended or was cancelled first)."""
    key = tagmod.machine_key(
        machine_tags.get(tagmod.CLUSTER, ""), machine_tags.get(tagmod.OP, ""), machine_tags.get(tagmod.INSTANCE, "")
    )
    try:
        os.unlink(config.workdir / "tokens" / f"{key}.token")
    except OSError:
        pass


#: A token file this old whose job is not live is left over (the job ended or was cancelled before its agent read
#: it, and nobody asked about it since). Younger files may belong to a submission in progress.
STALE_TOKEN_SECONDS = 120


def sweep_tokens(config: Config, live_keys: set[str], now: float) -> int:
    """Delete left-over token files (see ``STALE_TOKEN_SECONDS``); ``live_keys``: the machine keys of our live
    jobs. Returns how many were deleted."""
    removed = 0
    try:
        entries = list(os.scandir(config.workdir / "tokens"))
    except OSError:
        return 0
    for entry in entries:
        key = entry.name.removesuffix(".token")
        if not entry.name.endswith(".token") or key in live_keys:
            continue
        try:
            if now - entry.stat(follow_symlinks=False).st_mtime > STALE_TOKEN_SECONDS:
                os.unlink(entry.path)
                removed += 1
        except OSError:
            continue
    return removed


def live_keys(records: Iterable[JobRecord]) -> set[str]:
    return {
        tagmod.machine_key(r.tags.get(tagmod.CLUSTER, ""), r.tags.get(tagmod.OP, ""), r.tags.get(tagmod.INSTANCE, ""))
        for r in records
        if r.tags is not None and r.live
    }


#: The agent refuses an orphan timeout below its reply timeout (15 s unless ``agentExtraArgs`` changes it).
ORPHAN_TIMEOUT_FLOOR = 15.0


def time_limit(seconds: float) -> str:
    """``--time`` in whole minutes, rounded up (Slurm's own unit; at least 1): a machine's ``maxLifetime``."""
    return str(max(1, math.ceil(seconds / 60)))


def slurm_seconds(text: str) -> float:
    """A Slurm time (``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``, ``UNLIMITED``) in seconds."""
    if text.upper() in ("UNLIMITED", "INFINITE"):
        return math.inf
    days, dash, rest = text.partition("-")
    if not dash:
        days, rest = "0", text
    parts = [int(p) for p in rest.split(":")]
    if dash:  # after a day count: hours first
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
    elif len(parts) == 3:
        hours, minutes, seconds = parts
    else:
        hours, (minutes, seconds) = 0, (parts + [0])[:2]
    return float(((int(days) * 24 + hours) * 60 + minutes) * 60 + seconds)


def job_script(config: Config, template: Template, boot: Mapping[str, Any], token_file: Path) -> str:
    """The batch script: exec the agent. Everything in it is visible to whoever can read the job; no secret is.
    The template's probes (this config's, never the request's) are agent arguments like the others, each quoted
    whole: the pilot's shell passes them on as they are, and only the agent's ``/bin/sh -c`` runs them."""
    argv = [
        *config.agent_command,
        "--certs",
        config.certs,
        "--controllers",
        ",".join(boot["controllers"]),
        "--instance-ref",
        boot["instanceRef"],
        "--token-file",
        str(token_file),
        *config.agent_extra_args,
    ]
    if boot.get("orphanTimeout"):
        # The pilot job ending is the machine's return: exiting is all the agent has to do.
        argv += ["--orphan-timeout", f"{max(float(boot['orphanTimeout']), ORPHAN_TIMEOUT_FLOOR):g}"]
    argv += template.agent_args()
    line = " ".join(shlex.quote(a) for a in argv)
    return (
        "#!/bin/sh\n"
        "# provisionerd pilot job: runs the worker agent, which reads (and deletes) its join token from the\n"
        "# 0600 file named by --token-file.\n"
        f'exec {line} --machine-id "$SLURM_JOB_ID"\n'
    )


def sbatch_args(
    config: Config, template: Template, machine_tags: Mapping[str, str], key: str, max_lifetime: float = 0.0
) -> list[str]:
    """``max_lifetime``: the bootstrap's ``maxLifetime`` (the daemon's ``max_ttl``), as ``--time`` unless the
    template's own ``timeLimit`` is shorter: Slurm ends the pilot job (the machine) then, busy or not, even if
    nothing controls it any more."""
    resources = template.resource_args()
    shorter = template.time_limit is None or slurm_seconds(template.time_limit) > max_lifetime
    if max_lifetime > 0 and shorter:
        resources = [a for a in resources if not a.startswith("--time=")] + [f"--time={time_limit(max_lifetime)}"]
    args = [
        f"--job-name=pvd-{key}",
        f"--comment={tagmod.encode(machine_tags)}",
        f"--partition={config.partition}",
        *resources,
        f"--output={config.workdir / 'logs' / f'pvd-{key}-%j.out'}",
        f"--chdir={config.workdir}",
        f"--export={config.export}",
        "--no-requeue",
    ]
    if config.account:
        args.append(f"--account={config.account}")
    if config.qos:
        args.append(f"--qos={config.qos}")
    return args


def request_machines(config: Config, cluster: SlurmCluster, store: Store, doc: Mapping[str, Any]) -> dict[str, Any]:
    template, count = asked_template(config.templates, doc)
    owner = {k: doc["tags"][k] for k in (tagmod.CLUSTER, tagmod.PROVIDER, tagmod.OP, tagmod.EPOCH)}
    op_id = doc["op_id"]
    request_id = request_id_for("req", owner[tagmod.CLUSTER], op_id)
    with store.locked(request_id):
        record = store.load(request_id) or {
            "requestId": request_id,
            "kind": "req",
            "opId": op_id,
            "templateId": template.template_id,
            "tags": owner,
            "machines": {},
        }
        jobs = cluster.my_jobs()
        sweep_tokens(config, live_keys(jobs.values()), time.time())
        existing = cluster.owned(jobs, {tagmod.CLUSTER: owner[tagmod.CLUSTER], tagmod.OP: op_id})
        by_instance = {r.tags[tagmod.INSTANCE]: r.job_id for r in existing if r.tags and tagmod.INSTANCE in r.tags}
        machines: dict[str, str] = record["machines"]
        for ref, job_id in by_instance.items():
            machines.setdefault(ref, job_id)
        missing = [b for b in doc["bootstrap"] if b["instanceRef"] not in machines]
        if missing:
            tokens = _private_dir(config.workdir / "tokens")
            (config.workdir / "logs").mkdir(exist_ok=True)
        submitted: list[tuple[str, dict[str, str]]] = []
        for boot in missing:
            machine_tags = {**owner, tagmod.INSTANCE: boot["instanceRef"]}
            key = tagmod.machine_key(owner[tagmod.CLUSTER], op_id, boot["instanceRef"])
            token_file = tokens / f"{key}.token"
            write_token(token_file, boot["joinToken"])
            try:
                job_id = cluster.submit(
                    sbatch_args(config, template, machine_tags, key, float(boot.get("maxLifetime") or 0)),
                    job_script(config, template, boot, token_file),
                )
            except PluginError as err:
                if err.code != "throttled":
                    os.unlink(token_file)  # refused for good: no agent will ever read it
                # A throttled submit may have made the job after all (timeout): its agent needs the file, and the
                # retry (which finds that job by its tags) or the return removes it.
                store.save(record)  # the jobs submitted so far stay recorded for the retry
                raise
            machines[boot["instanceRef"]] = job_id
            submitted.append((job_id, machine_tags))
        store.save(record)
        if submitted:
            _refuse_hopeless(config, cluster, store, template, submitted)
    made = len(missing)
    again = len(doc["bootstrap"]) - made
    message = f"{made} pilot job(s) submitted to partition {config.partition!r}"
    if again:
        message += f"; {again} already existed for op_id {op_id!r}"
    return {"requestId": request_id, "message": message}


def _refuse_hopeless(
    config: Config, cluster: SlurmCluster, store: Store, template: Template, submitted: list[tuple[str, dict[str, str]]]
) -> None:
    """Slurm accepts some impossible jobs instead of refusing them: more CPUs than the whole partition has gives
    ``PENDING (PartitionConfig)`` forever, where one more than a node has is refused at once. Such a job is no
    queue delay, so the jobs just made are cancelled (they are ours, made by this very call) and the request is
    refused as ``invalid_request``, exactly like an sbatch refusal."""
    jobs = cluster.my_jobs()
    hopeless = {
        j: jobs[j].reason
        for j, _ in submitted
        if j in jobs and jobs[j].state in STARTING and jobs[j].reason in HOPELESS_REASONS
    }
    if not hopeless:
        return
    for job_id, machine_tags in submitted:
        store.mark_returned(job_id)
        cluster.cancel(job_id, tagmod.job_name(machine_tags))
        remove_token(config, machine_tags)
    reasons = ", ".join(sorted(set(hopeless.values())))
    raise PluginError(
        "invalid_request",
        f"Slurm can never run template {template.template_id!r} in partition "
        f"{config.partition!r} (pending reason {reasons}); the {len(submitted)} "
        "job(s) just submitted were cancelled",
    )
