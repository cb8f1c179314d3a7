"""What can be proven about a parsed config before the daemon runs it: timing that cannot work, files that are not
there, TLS material that does not fit together.

``Config.from_file`` checks the document (schema and cross-field rules) and reads no other file. ``prove(config,
now)`` goes further and looks at the world the config names; ``load_proven(path)`` is the two together, and it is
what accepts a config to run: ``provisionerd config check``, ``provisionerd run`` at start and on every SIGHUP
reload (a reload that fails a proof is refused and the running config kept). Every problem is ``"<field>:
<message>"`` in the style of ``config.problems`` (``tls.key: does not match the certificate in tls.cert``), so
the operator knows which key to fix.

Proven:

- ``lease.margin`` against ``lease.controller_ttl`` (the TTL the controller grants, when the config says it): a
  lease is trusted until ``sent + ttl - margin`` and renewed at ``sent + ttl * RENEW_FRACTION``, so the margin
  must leave a window past the first renewal (``lease_window_problem``, which the lease keeper also applies to the
  first real grant, whatever the config said);
- ``controller.heartbeat_interval`` against ``controller.peer_timeout`` (the silence after which the controller
  drops this daemon, when the config says it): at least two heartbeats must fit in it;
- provider paths: a one-shot plugin's directory exists and its ``<action>.sh`` scripts are executable files; a
  persistent plugin's executable (``path``, ``<path>/provider`` or ``argv[0]`` looked up on ``PATH``) exists and
  is executable; ``conf_dir`` is a directory; a legacy journal's directory exists. A missing path that names a
  shipped plugin says where the installed one is (``provisionerd provider path``);
- TLS: ``tls.ca``, ``tls.cert``, ``tls.key`` exist and are readable PEM, the key is the certificate's, the
  certificate is issued by the CA (directly or through intermediates in the certificate file), and neither is
  expired or not yet valid at ``now``.

Pure in the layering's sense (no trio, no sockets): file-system reads and ``cryptography`` only. No message
repeats key material or a provider's ``env`` value.
"""

from __future__ import annotations

import datetime
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes, PublicKeyTypes

from provisionerd import resources
from provisionerd.config.loader import Config, ProviderConfig
from provisionerd.domain.contract_actions import CONTRACT_ACTIONS  # the scripts a one-shot plugin directory may hold
from provisionerd.domain.errors import ConfigError

#: The share of a lease's TTL after which the keeper renews it (``controller.lease.LeaseKeeper``'s default).
RENEW_FRACTION = 1 / 3
#: A PEM file above this size is refused unread (bounded work on bad input).
MAX_PEM_BYTES = 1 << 20

Problem = tuple[str, str]  # (field, message)


def lease_window_problem(ttl: float, margin: float, renew_fraction: float = RENEW_FRACTION) -> str | None:
    """Why a lease of ``ttl`` seconds cannot be held with ``margin``, or ``None`` when it can.

    A grant sent at ``t`` is trusted until ``t + ttl - margin`` and renewed at ``t + ttl * renew_fraction``: when
    the first instant is not after the second, every lease lapses before its renewal goes out (with ``margin >=
    ttl``, every grant arrives already expired: ``grant_too_late`` forever)."""
    if margin >= ttl:
        return f"margin {margin:g}s is not below the lease TTL of {ttl:g}s: every grant is expired when it arrives"
    renew_at = ttl * renew_fraction
    if ttl - margin <= renew_at:
        return (
            f"margin {margin:g}s leaves {ttl - margin:g}s of a {ttl:g}s lease, not more than the {renew_at:g}s"
            " before its first renewal: the lease lapses before every renewal"
        )
    return None


def prove(config: Config, now: datetime.datetime) -> list[str]:
    """Every problem found in the world ``config`` names, as ``"<field>: <message>"``; empty when all hold.

    ``now`` (timezone-aware) judges certificate validity."""
    found: list[Problem] = []
    found += _timing(config)
    for i, provider in enumerate(config.providers):
        found += _provider_paths(i, provider)
    found += _tls(config, now)
    return [f"{field}: {message}" for field, message in found]


def load_proven(path: str | Path, now: datetime.datetime | None = None) -> Config:
    """``Config.from_file(path)``, then ``prove``: the config, or ``ConfigError`` with every problem.

    ``now`` defaults to the wall clock (certificates expire on it)."""
    config = Config.from_file(path)
    problems = prove(config, now or datetime.datetime.now(datetime.UTC))
    if problems:
        raise ConfigError(f"config {str(path)!r} cannot run: {len(problems)} problem(s)", problems)
    return config


def check_all(path: str | Path, now: datetime.datetime | None = None) -> tuple[Config | None, list[str]]:
    """Every problem of ``path`` at every stage, for ``provisionerd config check``: the document's (schema,
    cross-field rules), then the proofs, which still run when the document has problems, on what it has right
    (``Config.salvaged``: a refused value's default in its place; a proof about a field left out is not reported,
    it would judge the default). The config when there is no problem, else ``None``, with the problems.

    So an unknown key no longer hides a ``lease.margin`` that the controller's TTL cannot use."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        config = Config.from_file(path)
    except ConfigError as exc:
        problems = list(exc.problems) or [str(exc)]
        salvaged = Config.salvaged(path)
        if salvaged is None:
            return None, [*problems, f"(checks): {NOT_PROVEN}"]
        rest, left_out = salvaged
        proofs = [p for p in prove(rest, now) if not any(_names(p, field) for field in left_out)]
        return None, problems + [p for p in proofs if p not in problems]
    problems = prove(config, now)
    return (None if problems else config), problems


#: Said when the document is too broken for the later checks to run on the rest of it.
NOT_PROVEN = "the files, timing and TLS material the config names were not checked: fix the problems above first"


def _names(problem: str, field: str) -> bool:
    """Whether ``problem`` (``"<field>: <message>"``) is about ``field`` or a key inside it."""
    return problem.startswith((f"{field}: ", f"{field}.", f"{field}["))


# --- timing -------------------------------------------------------------------------------------------------------


def _timing(config: Config) -> Iterator[Problem]:
    ttl = config.lease.controller_ttl
    if ttl is not None:
        why = lease_window_problem(ttl, config.lease.margin)
        if why is not None:
            yield "lease.margin", f"{why} (lease.controller_ttl)"
    c = config.controller
    if c.peer_timeout is not None and 2 * c.heartbeat_interval > c.peer_timeout:
        yield (
            "controller.heartbeat_interval",
            f"{c.heartbeat_interval:g}s: fewer than two heartbeats fit in the controller's controller.peer_timeout"
            f" of {c.peer_timeout:g}s, so one late heartbeat drops the link",
        )


# --- provider paths -----------------------------------------------------------------------------------------------


def _shipped_hint(path: Path) -> str:
    """`` (shipped plugin 'local' is at ...)`` when the tail of ``path`` names a shipped plugin."""
    for name in resources.PLUGINS:
        if path.as_posix().endswith("/" + name) or path.as_posix() == name:
            try:
                installed = resources.plugin_dir(name)
            except resources.ResourceMissing:
                return ""
            return f" (the shipped plugin {name!r} is at {installed}: `provisionerd provider path {name}`)"
    return ""


def _executable_problem(path: Path) -> str | None:
    if not path.exists():
        return f"{path} does not exist{_shipped_hint(path.parent if path.name == 'provider' else path)}"
    if not path.is_file():
        return f"{path} is not a file"
    if not os.access(path, os.X_OK):
        return f"{path} is not executable (chmod +x)"
    return None


def _provider_paths(i: int, provider: ProviderConfig) -> Iterator[Problem]:
    where = f"providers[{i}]"
    if provider.transport == "oneshot" and provider.path is not None:
        yield from _oneshot_dir(f"{where}.path", provider.path)
    elif provider.transport == "persistent":
        if provider.argv:
            program = provider.argv[0]
            if shutil.which(program) is None:
                yield f"{where}.argv[0]", f"{program!r} is not an executable file (nor found on PATH)"
        elif provider.path is not None:
            target = provider.path / "provider" if provider.path.is_dir() else provider.path
            why = _executable_problem(target)
            if why is not None:
                yield f"{where}.path", why
    if provider.conf_dir is not None and not provider.conf_dir.is_dir():
        yield f"{where}.conf_dir", f"{provider.conf_dir} is not a directory"
    journal = provider.legacy.journal
    if journal is not None and not journal.parent.is_dir():
        yield f"{where}.legacy.journal", f"its directory {journal.parent} does not exist"


def _oneshot_dir(field: str, path: Path) -> Iterator[Problem]:
    if not path.exists():
        yield field, f"{path} does not exist{_shipped_hint(path)}"
        return
    if not path.is_dir():
        yield field, f"{path} is not a directory (a one-shot plugin is a directory of <action>.sh scripts)"
        return
    present = [path / f"{action}.sh" for action in CONTRACT_ACTIONS if (path / f"{action}.sh").exists()]
    if not present:
        yield field, f"{path} holds no <action>.sh script (requestMachines.sh, getRequestStatus.sh, ...)"
    for script in present:
        if not script.is_file():
            yield field, f"{script.name} is not a file"
        elif not os.access(script, os.X_OK):
            yield field, f"{script.name} is not executable (chmod +x {script})"


# --- TLS ----------------------------------------------------------------------------------------------------------


def _read_pem(field: str, path: Path) -> tuple[bytes | None, Problem | None]:
    try:
        with path.open("rb") as f:
            data = f.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        return None, (field, f"cannot read {path}: {exc.strerror or type(exc).__name__}")
    if len(data) > MAX_PEM_BYTES:
        return None, (field, f"{path} is larger than {MAX_PEM_BYTES} bytes")
    return data, None


def _certificates(field: str, path: Path) -> tuple[list[x509.Certificate], Problem | None]:
    data, problem = _read_pem(field, path)
    if data is None:
        return [], problem
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError:
        return [], (field, f"{path} holds no PEM certificate")
    return certs, None


def _validity(field: str, cert: x509.Certificate, now: datetime.datetime) -> Iterator[Problem]:
    if cert.not_valid_after_utc <= now:
        yield field, f"the certificate expired at {cert.not_valid_after_utc.isoformat()}"
    elif cert.not_valid_before_utc > now:
        yield field, f"the certificate is not valid before {cert.not_valid_before_utc.isoformat()}"


def _issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _chains(leaf: x509.Certificate, intermediates: list[x509.Certificate], roots: list[x509.Certificate]) -> bool:
    """Whether ``leaf`` is issued by a root, directly or through ``intermediates`` (each used once, bounded)."""
    current, unused = leaf, list(intermediates)
    for _ in range(len(intermediates) + 1):
        if any(_issued_by(current, root) for root in roots):
            return True
        parent = next((c for c in unused if _issued_by(current, c)), None)
        if parent is None:
            return False
        unused.remove(parent)
        current = parent
    return False


def _spki(key: CertificatePublicKeyTypes | PublicKeyTypes) -> bytes:
    return key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def _tls(config: Config, now: datetime.datetime) -> Iterator[Problem]:
    tls = config.tls
    roots, problem = _certificates("tls.ca", tls.ca)
    if problem is not None:
        yield problem
    for root in roots[:1]:
        yield from _validity("tls.ca", root, now)
    chain, problem = _certificates("tls.cert", tls.cert)
    if problem is not None:
        yield problem
    if chain:
        leaf = chain[0]
        yield from _validity("tls.cert", leaf, now)
        if roots and not _chains(leaf, chain[1:], roots):
            yield "tls.cert", f"is not issued by the CA in tls.ca ({tls.ca})"
    data, problem = _read_pem("tls.key", tls.key)
    if problem is not None:
        yield problem
        return
    assert data is not None
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        yield "tls.key", f"{tls.key} is encrypted: the daemon needs a key without a passphrase"
        return
    except (ValueError, UnsupportedAlgorithm):
        yield "tls.key", f"{tls.key} holds no PEM private key it can read"
        return
    if chain and _spki(key.public_key()) != _spki(chain[0].public_key()):
        yield "tls.key", f"does not match the certificate in tls.cert ({tls.cert})"
