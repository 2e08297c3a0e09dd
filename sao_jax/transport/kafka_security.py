"""TLS and SASL settings for every Kafka client of a run (producers, consumers, admin, probes).

A managed Kafka service wants SASL over TLS; a self-hosted cluster often TLS alone. The
settings come from the config (`transport.security_protocol`, `ssl_cafile`, `ssl_certfile`,
`ssl_keyfile`, `sasl_mechanism`, `sasl_username`; on a remote sampler the same names as
`sao-jax sampler` flags) and are non-secret; the secrets come from the environment only,
read by each process when it connects, so that they are never in config.json, a topic, a
spec handed to a sampler or a log:

  SAO_JAX_KAFKA_PASSWORD       the SASL password (required with SASL_PLAINTEXT / SASL_SSL)
  SAO_JAX_KAFKA_SSL_PASSWORD   the password of an encrypted `ssl_keyfile` (optional)

`settings(...)` checks them and returns kafka-python keyword arguments; `with_secrets` adds
the passwords at connection time.
"""

from __future__ import annotations

import os
import pathlib

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
PASSWORD_ENV = "SAO_JAX_KAFKA_PASSWORD"
SSL_PASSWORD_ENV = "SAO_JAX_KAFKA_SSL_PASSWORD"


class SecurityError(ValueError):
  """Settings that cannot make a connection (a missing file, a missing password, ...)."""


def settings(
  protocol: str = "PLAINTEXT",
  *,
  cafile: str = "",
  certfile: str = "",
  keyfile: str = "",
  mechanism: str = "PLAIN",
  username: str = "",
) -> dict:
  """kafka-python keyword arguments for these settings ({} for plain TCP)."""
  if protocol not in PROTOCOLS:
    raise SecurityError(f"security protocol {protocol!r} unknown; known: {', '.join(PROTOCOLS)}")
  if protocol == "PLAINTEXT":
    given = [n for n, v in (("ssl_cafile", cafile), ("sasl_username", username)) if v]
    if given or certfile or keyfile:
      raise SecurityError(
        f"{', '.join(given) or 'ssl_certfile/ssl_keyfile'} given but the security protocol is "
        "PLAINTEXT: set transport.security_protocol (SSL, SASL_SSL, SASL_PLAINTEXT)"
      )
    return {}
  out: dict = {"security_protocol": protocol}
  if protocol.endswith("SSL"):
    for name, path in (
      ("ssl_cafile", cafile),
      ("ssl_certfile", certfile),
      ("ssl_keyfile", keyfile),
    ):
      if path and not pathlib.Path(path).is_file():
        raise SecurityError(f"{name} {path!r}: no such file")
      if path:
        out[name] = path
    if bool(certfile) != bool(keyfile):
      raise SecurityError("a client certificate needs both ssl_certfile and ssl_keyfile")
    out["ssl_check_hostname"] = True
  elif cafile or certfile or keyfile:
    raise SecurityError(f"ssl_* files given but {protocol} does not use TLS")
  if protocol.startswith("SASL"):
    if mechanism not in MECHANISMS:
      raise SecurityError(f"SASL mechanism {mechanism!r} unknown; known: {', '.join(MECHANISMS)}")
    if not username:
      raise SecurityError(f"{protocol} needs sasl_username (and {PASSWORD_ENV} in the environment)")
    out.update(sasl_mechanism=mechanism, sasl_plain_username=username)
  return out


def from_config(t) -> dict:
  """`settings` of a TransportConfig."""
  return settings(
    t.security_protocol,
    cafile=t.ssl_cafile,
    certfile=t.ssl_certfile,
    keyfile=t.ssl_keyfile,
    mechanism=t.sasl_mechanism,
    username=t.sasl_username,
  )


def with_secrets(security: dict) -> dict:
  """`security` with the passwords from the environment added, for one client."""
  out = dict(security)
  if out.get("security_protocol", "").startswith("SASL"):
    password = os.environ.get(PASSWORD_ENV)
    if not password:
      raise SecurityError(
        f"{out['security_protocol']} as {out.get('sasl_plain_username')!r}: set the password "
        f"in the environment variable {PASSWORD_ENV} (it is never read from a config)"
      )
    out["sasl_plain_password"] = password
  if out.get("ssl_keyfile") and os.environ.get(SSL_PASSWORD_ENV):
    out["ssl_password"] = os.environ[SSL_PASSWORD_ENV]
  return out
