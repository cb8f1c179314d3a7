"""One rig for every real-process test and bench (issue 30): configs through the project's own config writer, and
the processes (reference controller, daemon, agents, plugins, moto, Slurm, the Kubernetes control plane, etcd)
started, waited for and stopped the same way everywhere.

- ``wait``: waits on something observable (a probe, a log line, a socket), never a fixed sleep; a wait that times
  out names what it waited for and what it saw last.
- ``procs``: a process in its own session with its output in a log file, stopped for sure (SIGCONT, SIGTERM once,
  SIGKILL of its group after a grace), built on the product's own ``provisionerd.demo.procs``.
- ``daemon``: a daemon config with test timings, the simulated provider's config, and ``provisionerd run`` as a
  process with its admin socket and events log.
- ``controller``: ``refcontroller serve`` as a process (restarted on the same store and addresses, beside a bench),
  known by its ready line.
- ``backends``: what the integration tier needs beyond pip; in CI a missing back end fails, elsewhere it skips.
- ``moto``: the EC2 emulator as a process.
- ``agents``: ``provisionerd agent`` with its token on stdin or in a file (a machine's boot script), and the agents
  a test left behind.
- ``pipes``: a plugin or CLI driven over its pipes, its environment given whole.
- ``memory``: the reference controller over in-memory streams and a daemon config for it (``MockClock`` tests).
- ``clock``: ``mock_run``, an async function on a bounded ``MockClock``.
- ``core``: the daemon core in the test's own process over real plugins (a recorder around a plugin's transport;
  the end-to-end form over Slurm and Kubernetes, its join tokens recorded).
- ``facts``: a reference controller's fact log, read in-process or from its file.
- ``plugin``: a provider plugin driven over its own interface (one-shot, persistent JSON lines), the conformance kit.
- ``scan``: processes found in ``/proc`` by their command line, or by a secret they show.
- ``etcd``, ``slurm``, ``k8s``: the integration back ends (``k8s``: ``kubernetes`` would shadow the client package).

The folder is on ``sys.path`` through pytest's ``pythonpath`` setting (pyproject.toml); benches add it themselves.
"""
