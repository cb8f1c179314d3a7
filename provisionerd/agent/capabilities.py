"""What this machine has, as the agent reports it at every join (``Join.capabilities``, protocol §4).

The report uses offer attribute names (:mod:`provisionerd.planner.offers`), so the daemon can check it against the
machine's template with the same compatibility function offers are chosen by (:mod:`provisionerd.planner.health`),
which takes nothing on trust: an attribute the template declares and the report does not mention falls short.

By default (``--no-report-host`` turns these off, see :func:`report`):

- ``ncpus``: the CPUs this process may run on (``sched_getaffinity``; ``cpu_count`` where that is missing);
- ``mem``: physical memory in MiB (``SC_PHYS_PAGES * SC_PAGE_SIZE``: the kernel's MemTotal, a little below a cloud's
  nominal size; the daemon allows for that);
- ``type``: the architecture (``platform.machine()`` upper-cased, LSF's ``type``);
- ``ngpus``: the GPUs whose runtime answers (:func:`gpu_count`: ``nvidia-smi --query-gpu=name
  --format=csv,noheader``, bounded like a probe; ``!timeout`` or ``!exit N`` when it does not answer, which is not a
  number, so a GPU template's machine falls short). Without ``nvidia-smi`` on ``PATH`` nothing is reported: the
  agent did not measure, and a GPU template's machine falls short with ``ngpus not reported``. A ``--probe
  ngpus=...`` (another vendor's tool) replaces it.

And always:

- one entry per **probe**: ``NAME=COMMAND`` pairs from the agent's own command line (``--probe``), which the provider
  plugin took from its own configuration or the machine's user data, e.g. ``gputype=nvidia-smi
  --query-gpu=name --format=csv,noheader | head -1``.

**Who may make the agent run a command.** Only whoever starts it: a probe comes from ``--probe`` and nowhere else.
Nothing the controller sends is ever run, and the report only goes out (the controller stores it and the daemon
reads it; neither can send a probe back). A probe runs through ``/bin/sh -c`` (a pipeline is the common case) in its
own session with standard input closed, for at most ``timeout`` seconds, after which its whole process group is
killed; at most ``MAX_OUTPUT`` bytes of its output are read and its first line, stripped, is the value (at most
``MAX_VALUE`` characters). A probe that fails, times out or prints nothing reports ``!`` and why (``!exit 127``,
``!timeout``, ``!empty``): not a number, so a template that declares a number there fails its check, which is the
point (a GPU machine whose driver is broken is not a GPU machine).
"""

from __future__ import annotations

import os
import platform
import selectors
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

#: The most probes an agent takes (the controller keeps at most 8 entries, four of them the built-in ones).
MAX_PROBES = 4
#: Bytes of a probe's output read; the rest is discarded unread.
MAX_OUTPUT = 4096
#: Characters of a value reported (the controller's bound).
MAX_VALUE = 64
#: Probe names: offer attribute names, 1..32 characters of ``[A-Za-z0-9_.:-]``.
MAX_NAME = 32
BUILT_IN = ("ncpus", "mem", "type")
#: The shipped GPU probe: the NVIDIA runtime's own tool, asked for one line per GPU it can reach (no shell).
GPU_COMMAND = ("nvidia-smi", "--query-gpu=name", "--format=csv,noheader")


def parse_probe(text: str) -> tuple[str, str]:
    """``NAME=COMMAND`` -> ``(name, command)``; ``ValueError`` naming what is wrong."""
    name, sep, command = text.partition("=")
    name = name.strip()
    if not sep or not command.strip():
        raise ValueError(f"a probe is NAME=COMMAND, not {text!r}")
    if not (0 < len(name) <= MAX_NAME and all(c.isascii() and (c.isalnum() or c in "_.:-") for c in name)):
        raise ValueError(f"a probe name is 1..{MAX_NAME} characters of letters, digits and _.:-, not {name!r}")
    if name in BUILT_IN:
        raise ValueError(f"{name!r} is reported by the agent itself; a probe cannot replace it")
    return name, command


def check_probes(probes: Sequence[tuple[str, str]]) -> dict[str, str]:
    """The probes as ``{name: command}``; ``ValueError`` for too many or a name given twice."""
    if len(probes) > MAX_PROBES:
        raise ValueError(f"at most {MAX_PROBES} probes, not {len(probes)}")
    out: dict[str, str] = {}
    for name, command in probes:
        if name in out:
            raise ValueError(f"probe {name!r} given twice")
        out[name] = command
    return out


def built_in() -> dict[str, str]:
    """``ncpus``, ``mem`` (MiB) and ``type`` of this machine."""
    try:
        ncpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        ncpus = os.cpu_count() or 1
    mem_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1 << 20)
    return {"ncpus": str(ncpus), "mem": str(mem_mb), "type": platform.machine().upper()[:MAX_VALUE]}


def run_probe(command: str, timeout: float) -> str:
    """The value ``command`` reports (see the module docstring); never raises for the command's sake."""
    output, failed = _run(["/bin/sh", "-c", command], timeout)
    if failed:
        return failed
    lines = output.decode(errors="replace").strip().splitlines()
    value = lines[0].strip() if lines else ""
    if not value:
        return "!empty"
    return _printable(value)


def gpu_count(timeout: float) -> str | None:
    """``ngpus``: how many GPUs the NVIDIA runtime answers for (the shipped GPU probe, :data:`GPU_COMMAND`);
    ``None`` (not measured) without ``nvidia-smi`` on ``PATH``; ``!timeout`` / ``!exit N`` when it is there and does
    not answer."""
    tool = shutil.which(GPU_COMMAND[0])
    if tool is None:
        return None
    output, failed = _run([tool, *GPU_COMMAND[1:]], timeout)
    if failed:
        return failed
    return str(sum(1 for line in output.decode(errors="replace").splitlines() if line.strip()))


def _printable(value: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in value)[:MAX_VALUE]


def _run(argv: list[str], timeout: float) -> tuple[bytes, str]:
    """Run ``argv`` bounded (its own session, stdin closed, ``timeout``, ``MAX_OUTPUT`` bytes read, its group killed
    after): ``(output, "")``, or ``(b"", why)`` when it could not start, timed out or exited non-zero."""
    try:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        return b"", _printable(f"!cannot start: {exc.strerror or type(exc).__name__}")
    assert process.stdout is not None
    try:
        output, cut = _bounded_communicate(process, timeout)
    except subprocess.TimeoutExpired:
        return b"", "!timeout"
    finally:
        _kill_group(process)
    if process.returncode != 0 and not cut:  # cut: we stopped reading, so it may have died of SIGPIPE
        return b"", f"!exit {process.returncode}"
    return output[:MAX_OUTPUT], ""


def _bounded_communicate(process: subprocess.Popen[bytes], timeout: float) -> tuple[bytes, bool]:
    """Read at most ``MAX_OUTPUT`` bytes within ``timeout``, then wait for the exit within what is left: the output
    and whether it was cut at ``MAX_OUTPUT``."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    chunks: list[bytes] = []
    size = 0
    fd = process.stdout.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while size < MAX_OUTPUT:
            left = deadline - time.monotonic()
            if left <= 0:
                raise subprocess.TimeoutExpired(process.args, timeout)
            if not selector.select(left):
                continue
            chunk = os.read(fd, MAX_OUTPUT - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    process.stdout.close()  # a probe that prints more than we read gets SIGPIPE instead of blocking
    process.wait(timeout=max(deadline - time.monotonic(), 0.001))
    return b"".join(chunks), size >= MAX_OUTPUT


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    """The probe's whole process group goes (a pipeline's members, anything it left behind); reaped."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if process.stdout is not None and not process.stdout.closed:
        process.stdout.close()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def report(probes: Mapping[str, str], timeout: float, *, host: bool = True) -> dict[str, str]:
    """The whole report: with ``host`` (the default; ``--no-report-host`` for an agent whose template declares a
    nominal size its machine does not show, such as a process playing a machine on a test host), the built-in
    entries and the shipped GPU probe (unless a probe of the same name replaces it), then each probe's value
    (probes run one after another)."""
    out = built_in() if host else {}
    if host and "ngpus" not in probes:
        gpus = gpu_count(timeout)
        if gpus is not None:
            out["ngpus"] = gpus
    for name, command in probes.items():
        out[name] = run_probe(command, timeout)
    return out
