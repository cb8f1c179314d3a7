"""Process helpers for the demo tests: run ``provisionerd demo`` as a real subprocess with ``TMPDIR`` set to the
test's ``tmp_path`` (so everything of the run — its directory, the daemon's and the controller's command lines, every
agent's data-dir label, the plugin's environment — names ``tmp_path``), and find any process that still does.

The scan here is the tests' own (it does not use ``provisionerd.demo_procs``), so a bug there cannot hide a leak.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rigs import pipes, procs

REPO = Path(__file__).resolve().parents[2]


def processes_naming(text: str) -> list[tuple[int, list[str]]]:
    """``(pid, argv)`` of every live process of this user (not a zombie) whose command line or environment
    contains ``text``."""
    found = []
    needle = text.encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
            raw = Path(entry.path, "cmdline").read_bytes()
            env = Path(entry.path, "environ").read_bytes()
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue
        if stat[stat.rfind(")") + 2 :].split()[0] in ("Z", "X") or not raw:
            continue
        if needle in raw or needle in env:
            found.append((int(entry.name), raw.decode(errors="replace").split("\0")))
    return found


def agents_naming(text: str) -> list[tuple[int, list[str]]]:
    """The worker agents among ``processes_naming(text)``."""
    return [(pid, argv) for pid, argv in processes_naming(text) if "agent" in argv and "--machine-id" in argv]


def demo_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["TMPDIR"] = str(tmp_path)
    env["PYTHONPATH"] = str(REPO)
    return env


def start_demo(tmp_path: Path, *args: str) -> subprocess.Popen[bytes]:
    """``provisionerd demo ARGS`` in its own session, its output on pipes, run from ``tmp_path``."""
    argv = procs.provisionerd("demo", *args)
    return pipes.piped(argv, env=demo_env(tmp_path), cwd=tmp_path, stdin=subprocess.DEVNULL)
