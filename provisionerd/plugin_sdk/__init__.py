"""The plugin SDK: what a provider plugin written in Python imports instead of writing again.

A plugin stays a separate process that the daemon starts (``docs/providers.md``); this package is a library it
imports, not a framework that runs it. One module a concept:

    entry       ``main``: ``run.py persistent`` or ``run.py oneshot ACTION -f IN.json`` -> the right transport
    oneshot     ``serve_oneshot``: ``<action>.sh -f in.json`` -> one document on stdout, exit 0 or 1
    lines       ``serve_lines``: the persistent transport, JSON lines in and out, calls in flight in threads
    calls       ``run_action``: one call to a result or an error body, never an exception; one JSON log line;
                ``dispatch``: an action table, unknown actions and bad inputs refused
    errors      ``PluginError``: a contract error code, a message free of secrets, whether a retry may help
    config      ``load_config``: ``$PRO_CONF_DIR/<name>.json`` read and checked, failures as typed ``ConfigError``
                (``CONTRACT_CODE``: the one mapping to contract codes)
    datadir     ``data_dir``, ``private_dirs``, ``record_name``: ``$PRO_DATA_DIR`` and its 0700 record folders
    atomic      ``write_private``: replace a file atomically (0600 temporary file, fsync, rename, fsync the dir)
    redact      ``Redactor``, ``join_tokens``: scrub secrets and a call's join tokens from anything written
    logs        ``setup_logging``: stderr logging, every line scrubbed
    inputs      ``asked_template``: a ``requestMachines`` template must be offered and the count within it
    documents   ``describe``, ``request_status``, ``unknown_request``: answers as plain dicts
    ids         ``make_request_id``, ``parse_request_id``: request ids that carry their op_id
    values      the contract's documents as frozen attrs values (needs ``attrs``; the rest is standard library)

Everything but ``values`` is standard library only, and nothing here imports the rest of provisionerd, so a plugin
run as ``python -S`` (the local and simulated plugins) can use it. This file imports nothing: a plugin pays only
for the modules it uses.
"""
