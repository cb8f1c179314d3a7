"""Starting one machine of the local provider: a worker-agent process in its own session.

The agent's owner tags and ``--machine-id`` go on its command line (``procs.py`` finds it by them); its join token
goes to its stdin and nowhere else. The environment is the few variables an agent needs, plus ``PYTHONPATH`` when
this runs from a checkout, so the agent imports the same code.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from localprovider import conf as conf_mod
from localprovider import procs
from localprovider.store import RUNNING, Store

FAILED = "failed"  # the agent could not be started at all
INHERITED_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
#: providers/local/localprovider/spawn.py -> the repository root, when the plugin runs from a checkout.
REPO_ROOT = Path(__file__).resolve().parents[3]


def spawn_agent(conf: conf_mod.Conf, record: dict[str, Any], boot: Mapping[str, Any], store: Store) -> None:
    """Start the agent of ``record`` in its own session, its join token on stdin, and record the outcome
    (``running`` with its pid and start time, or ``failed`` with why)."""
    home = str(store.root)
    argv = [
        *conf.agent_command,
        "--certs",
        conf.certs_dir,
        "--controllers",
        ",".join(boot["controllers"]),
        "--instance-ref",
        record["instanceRef"],
        "--token-stdin",
        "--machine-id",
        record["machineId"],
        "--heartbeat",
        f"{conf.heartbeat:g}",
        "--reply-timeout",
        f"{conf.reply_timeout:g}",
    ]
    if boot.get("orphanTimeout"):  # never below the reply timeout, which the agent refuses
        argv += ["--orphan-timeout", f"{max(float(boot['orphanTimeout']), conf.reply_timeout):g}"]
    template = conf.template(record["templateId"])
    for name, command in template.probes if template is not None else ():
        argv += ["--probe", f"{name}={command}"]  # from this plugin's own config, never from a request
    if template is not None and not template.report_host:
        argv.append("--no-report-host")  # a process playing a machine of a nominal size: nothing of the host
    if template is not None and template.reprobe_interval is not None:
        argv += ["--reprobe-interval", f"{template.reprobe_interval:g}"]
    for key, value in sorted(record["tags"].items()):
        argv += ["--label", f"{key}={value}"]
    argv += ["--label", f"{procs.HOME_LABEL}={home}"]
    env = {k: os.environ[k] for k in INHERITED_ENV if k in os.environ}
    if (REPO_ROOT / "provisionerd" / "__init__.py").is_file():
        env["PYTHONPATH"] = str(REPO_ROOT)  # run from a checkout: the agent imports this checkout's code
    try:
        with open(store.log_path(record["machineId"]), "ab") as log:
            # Its own session: the agent outlives this call, and the daemon's kill of our process group.
            process = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=home,
                env=env,
                start_new_session=True,
                close_fds=True,
            )
    except (OSError, ValueError) as exc:
        record.update(state=FAILED, message=f"cannot start the agent: {exc.__class__.__name__}: {exc}"[:500])
        store.put_machine(record)
        return
    stat = procs.proc_stat(process.pid)
    record.update(state=RUNNING, pid=process.pid, starttime=stat.starttime if stat else 0)
    store.put_machine(record)
    assert process.stdin is not None
    try:
        process.stdin.write(boot["joinToken"].encode() + b"\n")
        process.stdin.close()
    except OSError:
        pass  # the agent is already gone: its status will say so
    process.returncode = 0  # never waited for here: keeps Popen from warning; reaping is done elsewhere
