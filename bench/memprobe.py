"""What a process's heap holds (issue 36 item 2): run a module under this probe, signal it, read the files.

Run from the repository root inside the project's environment, in place of ``python -m MODULE ARGS``::

    python bench/memprobe.py --out DIR [--tracemalloc FRAMES] -m MODULE ARGS...

``bench/steady.py --memory DIR`` runs the daemon this way and signals it at the end of its run. On ``SIGUSR1`` the
probe writes, from a thread of its own (the signal handler only starts it, so the event loop is never the one
interrupted by the work):

- ``DIR/objects.txt``: the process's resident set, then every type's object count and their shallow sizes
  (``sys.getsizeof``), largest first, and the ``str``, ``float``, ``int`` and ``bytes`` objects one reference away
  from them (the collector does not track those, so they are counted where they are held). ``gc.freeze`` (which
  the daemon's link calls after each page of a big resync) hides frozen objects from ``gc.get_objects``: the
  probe unfreezes them for the count and freezes everything again after it, so run it at the end of a bench, not
  in a process that lives on (cyclic garbage alive at that moment is then never collected);
- ``DIR/pymalloc.txt``: ``sys._debugmallocstats()`` (arenas, pools, bytes in used and in free blocks: how much of
  the resident set is live objects and how much the allocator keeps for later);
- ``DIR/tracemalloc.txt`` with ``--tracemalloc FRAMES`` (tracing from the start, which doubles the process's memory
  and slows it): the traced total and peak and the 40 largest allocation sites, grouped by their innermost frame in
  ``provisionerd``, with the frame that made each (``FRAMES`` deep);
- ``DIR/done`` last, so a reader waits for it.
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import runpy
import signal
import sys
import threading
import tracemalloc
from pathlib import Path

#: The atoms the collector does not track, counted one reference away from the objects that hold them.
ATOMS = (str, float, int, bytes)


def _status() -> str:
    with open("/proc/self/status") as f:
        return "".join(line for line in f if line.startswith(("VmRSS", "VmHWM")))


def _type_name(tp: type) -> str:
    return f"{getattr(tp, '__module__', '?')}.{getattr(tp, '__qualname__', '?')}"


def name_of_holder(obj: object) -> str:
    """A holder's type; a container's with its size bucket (a 100k-entry dict is an index, a 2-tuple a pair)."""
    name = _type_name(type(obj))
    if isinstance(obj, (dict, tuple, list, set, frozenset)):
        n = len(obj)
        return f"{name}[{n if n < 16 else '16+' if n < 1000 else '1000+'}]"
    return name


def _attribute_of(holder: object, held: object) -> str:
    """The attribute or key of ``holder`` that is ``held`` ("?" when neither)."""
    names = list(getattr(type(holder), "__slots__", ())) + list(getattr(holder, "__dict__", {}))
    for cls in type(holder).__mro__:
        names += list(getattr(cls, "__slots__", ()))
    for name in names:
        if getattr(holder, name, None) is held:
            return f".{name}"
    if isinstance(holder, dict):
        for key, value in holder.items():
            if value is held:
                return f"[{key!r:.40}]"
    return "?"


def big_containers(at_least: int = 10_000) -> list[str]:
    """Each container of ``at_least`` entries: its type, length, element type and its holders (with the attribute
    that holds it, and that holder's own holder when it is a plain ``__dict__``)."""
    lines = []
    for obj in gc.get_objects():
        if not isinstance(obj, (dict, list, set, frozenset, tuple)) or len(obj) < at_least:
            continue
        sample = next(iter(obj.items() if isinstance(obj, dict) else obj), None)
        holders = []
        for holder in gc.get_referrers(obj):
            if holder is obj or type(holder).__name__ == "frame":
                continue
            holders.append(f"{_type_name(type(holder))}{_attribute_of(holder, obj)}")
        element = (
            type(sample).__name__
            if not isinstance(sample, tuple)
            else "(" + ", ".join(type(x).__name__ for x in sample) + ")"
        )
        lines.append(f"{len(obj):10d}  {type(obj).__name__} of {element}  held by {'; '.join(holders[:4]) or '-'}")
    return lines


def objects_report() -> str:
    """Counts and shallow sizes per type of every object the collector tracks, frozen ones included, and of the
    atoms they hold directly."""
    frozen = gc.get_freeze_count()
    gc.unfreeze()
    try:
        big = big_containers()
        counts: collections.Counter[str] = collections.Counter()
        sizes: collections.Counter[str] = collections.Counter()
        seen: set[int] = set()
        atoms_by_holder: collections.Counter[str] = collections.Counter()
        atom_sizes: collections.Counter[str] = collections.Counter()
        for obj in gc.get_objects():
            name = _type_name(type(obj))
            counts[name] += 1
            sizes[name] += sys.getsizeof(obj)
            for ref in gc.get_referents(obj):
                if type(ref) in ATOMS and id(ref) not in seen:
                    seen.add(id(ref))
                    name = f"{type(ref).__name__} (held by the above)"
                    counts[name] += 1
                    sizes[name] += sys.getsizeof(ref)
                    held = f"{type(ref).__name__} held first by {name_of_holder(obj)}"
                    atoms_by_holder[held] += 1
                    atom_sizes[held] += sys.getsizeof(ref)
    finally:
        gc.freeze()
    lines = [_status().rstrip(), f"frozen before the count: {frozen}", f"{'count':>10} {'MB':>9}  type"]
    for name, size in sizes.most_common(60):
        lines.append(f"{counts[name]:10d} {size / 1e6:9.2f}  {name}")
    lines.append("containers of 10,000 entries or more, with what holds them:")
    lines += big
    lines.append("atoms by the first object found holding them (a dict or tuple as its length):")
    for name, size in atom_sizes.most_common(30):
        lines.append(f"{atoms_by_holder[name]:10d} {size / 1e6:9.2f}  {name}")
    return "\n".join(lines) + "\n"


def tracemalloc_report(limit: int = 40) -> str:
    snapshot = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    groups: collections.Counter[str] = collections.Counter()
    blocks: collections.Counter[str] = collections.Counter()
    for stat in snapshot.statistics("traceback"):
        ours = [f for f in stat.traceback if f"{os.sep}provisionerd{os.sep}" in f.filename]
        where = ours[-1] if ours else stat.traceback[-1]
        key = f"{where.filename}:{where.lineno}"
        groups[key] += stat.size
        blocks[key] += stat.count
    lines = [f"traced now {current / 1e6:.1f} MB, peak {peak / 1e6:.1f} MB", f"{'MB':>9} {'blocks':>9}  site"]
    for key, size in groups.most_common(limit):
        lines.append(f"{size / 1e6:9.2f} {blocks[key]:9d}  {key}")
    return "\n".join(lines) + "\n"


def write_reports(out: Path) -> None:
    (out / "done").unlink(missing_ok=True)
    try:
        (out / "objects.txt").write_text(objects_report())
        if tracemalloc.is_tracing():
            (out / "tracemalloc.txt").write_text(tracemalloc_report())
        fd = os.open(out / "pymalloc.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        saved = os.dup(2)
        try:  # _debugmallocstats writes to the C stderr
            sys.stderr.flush()
            os.dup2(fd, 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(fd)
    except Exception as exc:  # noqa: BLE001 - a probe must not take the process down; the reader sees why
        (out / "error.txt").write_text(f"{type(exc).__name__}: {exc}\n")
    (out / "done").write_text("")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tracemalloc", type=int, default=0, metavar="FRAMES")
    parser.add_argument("-m", dest="module", required=True, help="the module to run; what follows is its argv")
    at = sys.argv.index("-m") if "-m" in sys.argv else len(sys.argv)
    args = parser.parse_args(sys.argv[1 : at + 2])
    rest = sys.argv[at + 2 :]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tracemalloc:
        tracemalloc.start(args.tracemalloc)
    signal.signal(signal.SIGUSR1, lambda *_: threading.Thread(target=write_reports, args=(args.out,)).start())
    sys.argv = [args.module, *rest]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
