"""Optional TLS for connections between hosts (``ssl`` from the standard library).

Set ``DANAUS_TLS_CERT``, ``DANAUS_TLS_KEY`` and ``DANAUS_TLS_CA`` (PEM files)
in the client and on every worker (``danaus worker --tls-cert ... --tls-key
... --tls-ca ...`` sets them): every TCP connection is then mutual TLS, each
side presenting its certificate and checking the other's against the CA,
and the job secret's handshake runs inside it. Hostnames are not checked
(procs are reached by IP address); the CA is what is trusted. Connections on
one host (Unix sockets) are not affected.
"""

from __future__ import annotations

import functools
import ssl

from .. import _config as config

__all__ = ["client_context", "enabled", "server_context"]


def _files() -> tuple[str, str, str] | None:
    cert, key, ca = (config.get(f"tls_{k}") for k in ("cert", "key", "ca"))
    if not (cert or key or ca):
        return None
    if not (cert and key and ca):
        raise ValueError(
            "TLS needs all of DANAUS_TLS_CERT, DANAUS_TLS_KEY and DANAUS_TLS_CA; got "
            f"cert={cert!r}, key={key!r}, ca={ca!r}"
        )
    return cert, key, ca


def enabled() -> bool:
    return _files() is not None


def server_context() -> ssl.SSLContext | None:
    """The context of the accepting side, or None without TLS (the settings of now)."""
    files = _files()
    return None if files is None else _server_context(files)


def client_context() -> ssl.SSLContext | None:
    """The context of the dialling side, or None without TLS (the settings of now)."""
    files = _files()
    return None if files is None else _client_context(files)


# Cached per set of files, not once for all: TLS configured after a first connection
# (or turned off) takes effect at the next one instead of being silently ignored.
@functools.lru_cache(maxsize=4)
def _server_context(files: tuple[str, str, str]) -> ssl.SSLContext:
    cert, key, ca = files
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


@functools.lru_cache(maxsize=4)
def _client_context(files: tuple[str, str, str]) -> ssl.SSLContext:
    cert, key, ca = files
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # peers are addressed by IP; the CA is the trust anchor
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(ca)
    return ctx
