"""One rig for every real-process test and bench (issue 30): configs through the project's own config writer, and
the processes (reference controller, daemon, agents, plugins, moto, Slurm, the Kubernetes control plane, etcd)
started, waited for and stopped the same way everywhere.

- ``wait``: waits on something observable (a probe, a log line, a socket), never a fixed sleep; a wait that times
  out names what it waited for and what it saw last.
- ``procs``: a process in its own session with its output in a log file, stopped for sure (SIGCONT, SIGTERM once,
  SIGKILL of its group after a grace), built on the product's own ``provisionerd.demo.procs``.
- ``daemon``: a daemon config with test timings, the simulated provider's config, and ``provisionerd run`` as a
  process with its admin socket and events log.
- ``controller``: ``refcontroller serve`` as a process.
- ``backends``: what the integration tier needs beyond pip; in CI a missing back end fails, elsewhere it skips.
- ``moto``: the EC2 emulator as a process.
- ``serve``: ``refcontroller serve`` as a process of a test or a bench, known by its ready line.
- ``core``: the daemon's core in the test's own trio run, over real plugins, its join tokens recorded.
- ``plugin``: a provider plugin driven over its own interface (one-shot, persistent JSON lines), the conformance kit.
- ``scan``: processes found in ``/proc`` by their command line, or by a secret they show.
- ``etcd``, ``slurm``, ``k8s``: the integration back ends (``k8s``: ``kubernetes`` would shadow the client package).

The folder is on ``sys.path`` through pytest's ``pythonpath`` setting (pyproject.toml); benches add it themselves.
"""
