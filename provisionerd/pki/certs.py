"""A cluster's certificate authority and one certificate per role, made with ``cryptography``.

Layout of a certs directory (what ``provisionerd certs init DIR --cluster NAME`` writes)::

    ca.pem  ca.key                      the cluster CA (EC P-256); ca.key is needed only to issue more
    controller.pem  controller.key      server + client auth; valid for the --host names (localhost, 127.0.0.1)
    provisioner.pem provisioner.key     client auth
    worker.pem  worker.key              client auth (one shared worker identity; a worker proves itself by token)
    admin.pem  admin.key                client auth

The role and the cluster are bound into each certificate twice: as the SAN URI ``provisionerd://<cluster>/<role>``
(what ``wire.tls.peer_role`` reads) and as the subject's OU (role) and O (cluster), for humans and ``openssl x509``.
Private keys are written 0600 and never overwritten unless ``force`` is set.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from provisionerd.domain.errors import ConfigError
from provisionerd.domain.model import Role

URI_SCHEME = "provisionerd"
DEFAULT_HOSTS = ("localhost", "127.0.0.1", "::1")
CA_DAYS = 3650
LEAF_DAYS = 825
_CLUSTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def role_uri(cluster: str, role: Role) -> str:
    return f"{URI_SCHEME}://{cluster}/{role.value}"


def parse_role_uri(uri: str) -> tuple[str, str] | None:
    """``(cluster, role value)`` from ``provisionerd://<cluster>/<role>``; ``None`` if it is not one of ours."""
    prefix = f"{URI_SCHEME}://"
    if not uri.startswith(prefix):
        return None
    cluster, sep, role = uri[len(prefix) :].partition("/")
    return (cluster, role) if sep and cluster and role and "/" not in role else None


def cert_paths(directory: Path | str, name: str) -> tuple[Path, Path]:
    """``(<name>.pem, <name>.key)`` in ``directory``; ``name`` is ``ca`` or a role value."""
    directory = Path(directory)
    return directory / f"{name}.pem", directory / f"{name}.key"


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _name(cluster: str, common: str, unit: str | None = None) -> x509.Name:
    parts = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, cluster)]
    if unit:
        parts.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit))
    parts.append(x509.NameAttribute(NameOID.COMMON_NAME, common))
    return x509.Name(parts)


def _builder(subject: x509.Name, issuer: x509.Name, key, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))  # tolerate small clock skew between hosts
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )


def make_ca(cluster: str, days: int = CA_DAYS) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _new_key()
    name = _name(cluster, f"provisionerd CA {cluster}")
    cert = (
        _builder(name, name, key, days)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(f"{URI_SCHEME}://{cluster}/ca")]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    return cert, key


def make_role_cert(
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    cluster: str,
    role: Role,
    hosts: Sequence[str] = (),
    days: int = LEAF_DAYS,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A leaf for ``role`` signed by the CA. ``hosts`` (DNS names or IP addresses) make it valid as a server."""
    key = _new_key()
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role_uri(cluster, role))]
    for host in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            sans.append(x509.DNSName(host))
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if hosts else [])
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (
        _builder(_name(cluster, f"{cluster}-{role.value}", role.value), ca_cert.subject, key, days)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def _write(path: Path, data: bytes, mode: int, force: bool) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    # Created with its final mode so a key is never readable by others, not even for a moment.
    fd = os.open(path, flags, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(path, mode)  # O_CREAT's mode is filtered by the umask; a forced rewrite keeps the old mode otherwise


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def init_certs(
    directory: Path | str,
    cluster: str,
    hosts: Sequence[str] = DEFAULT_HOSTS,
    force: bool = False,
) -> list[Path]:
    """Create the CA and a certificate + key per role in ``directory``; return the files written.

    Raises:
        ConfigError: ``cluster`` is not a plain name, a host is empty, or files exist and ``force`` is not set.
    """
    if not _CLUSTER_RE.match(cluster):
        raise ConfigError(f"cluster name must be 1-63 of [A-Za-z0-9._-] starting alphanumeric, not {cluster!r}")
    if not hosts or any(not h or "/" in h for h in hosts):
        raise ConfigError(f"controller host names must be non-empty names or addresses, not {list(hosts)!r}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    names = ["ca", *(role.value for role in Role)]
    existing = [p for n in names for p in cert_paths(directory, n) if p.exists()]
    if existing and not force:
        raise ConfigError(
            f"refusing to overwrite existing certificate files in {str(directory)!r} (use --force)",
            [str(p) for p in existing],
        )
    ca_cert, ca_key = make_ca(cluster)
    issued = [("ca", ca_cert, ca_key)]
    for role in Role:
        cert, key = make_role_cert(ca_cert, ca_key, cluster, role, hosts if role is Role.CONTROLLER else ())
        issued.append((role.value, cert, key))
    written: list[Path] = []
    for name, cert, key in issued:
        pem, key_path = cert_paths(directory, name)
        _write(key_path, _key_pem(key), 0o600, force)
        _write(pem, cert.public_bytes(serialization.Encoding.PEM), 0o644, force)
        written += [pem, key_path]
    return written


def read_cluster(directory: Path | str) -> str:
    """The cluster a certs directory belongs to, from its CA certificate (the O of its subject)."""
    pem, _ = cert_paths(directory, "ca")
    try:
        cert = x509.load_pem_x509_certificate(pem.read_bytes())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read the CA certificate {str(pem)!r}: {exc}") from None
    names = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)
    if not names:
        raise ConfigError(f"CA certificate {str(pem)!r} names no cluster (subject O)")
    return str(names[0].value)
