"""The reference cluster controller: speaks the controller's wire protocol for tests, the demo and third parties.

The daemon never imports this package. It is built from ``provisionerd.domain.model``,
``provisionerd.domain.errors`` and ``provisionerd.wire``, and laid out in layers (each module imports only those
above it in this list):

pure core (synchronous; every time is passed in as ``now``)
    ``jsonconv``   the one cattrs converter: facts (tagged ``"kind"``), demand items, status documents
    ``store``      SQLite: fact log, HA term, demand, join-token claims and used tokens (durable); its
                   incarnation and the mark that makes a lost or damaged store refuse to open
    ``replicas``   replica set: primary, durable term, promotion time, the quorum switch
    ``leases``     per-provider lease table of one primary in one term (memory only)
    ``commits``    fact shape checks and the epoch rule
    ``workers``    single-use join tokens and host states
    ``demand``, ``paging``     the demand snapshot and its seq; page bounds for resync facts
    ``addresses``  HOST:PORT parsing and formatting
    ``cluster``    all of the above behind one facade: what each request does
trio shell
    ``replies``    simple request -> reply
    ``session``    one joined connection: reader (allowlist, heartbeat timeout) and pusher (demand, hosts);
                   it names ``server`` only for type checking
    ``server``     ``ControllerServer.handle_stream(stream, replica, role=None)`` over any trio ``Stream``
    ``listeners``  ``serve(config)``: one mutual-TLS listener per replica
clients and entry points
    ``admin``      ``AdminClient`` (admin certificate, follows redirects)
    ``api``        ``open_refcontroller`` (in process) and ``open_refcontroller_process`` (subprocess)
    (the JSON demand document ``refcontroller admin demand --file`` reads is ``provisionerd.config.demand_doc``,
    the same reader ``provisionerd plan --what-if`` uses)
    ``cli``        ``refcontroller serve`` and ``refcontroller admin``
"""
