"""A TLS terminator for tests: clients speak TLS to it, it speaks plain TCP to a local broker
(the way a load balancer or stunnel fronts a broker). The local broker (tansu 0.6.0) takes
`--cert` but still serves plain TCP, so TLS between Kafka clients and a broker is tested
through this, with the broker advertising the terminator's address."""

from __future__ import annotations

import asyncio
import contextlib
import pathlib
import shutil
import ssl
import subprocess
import threading

from sao_jax.transport.broker import free_port


def self_signed(directory: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
  """(certificate, key) for 127.0.0.1 and localhost, made with the openssl command."""
  if shutil.which("openssl") is None:
    import pytest

    pytest.skip("no openssl command to make a test certificate")
  cert, key = directory / "cert.pem", directory / "key.pem"
  subprocess.run(
    [
      "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
      "-keyout", str(key), "-out", str(cert), "-subj", "/CN=localhost",
      "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost",
    ],
    check=True,
    capture_output=True,
  )  # fmt: skip
  return cert, key


class TlsTerminator:
  """Context manager: TLS on 127.0.0.1:`port`, each connection piped to `target`."""

  def __init__(self, target: str, cert: pathlib.Path, key: pathlib.Path, port: int = 0):
    host, _, target_port = target.rpartition(":")
    self.target = (host, int(target_port))
    self.port = port or free_port()
    self.address = f"127.0.0.1:{self.port}"
    self.ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    self.ctx.load_cert_chain(cert, key)
    self.loop = asyncio.new_event_loop()
    self.handshake_failures = 0

  async def _pipe(self, reader, writer):
    try:
      while data := await reader.read(65536):
        writer.write(data)
        await writer.drain()
    except (ConnectionError, ssl.SSLError, OSError):
      pass
    finally:
      with contextlib.suppress(Exception):
        writer.close()

  async def _handle(self, reader, writer):
    try:
      up_reader, up_writer = await asyncio.open_connection(*self.target)
    except OSError:
      writer.close()
      return
    await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer))

  def __enter__(self) -> TlsTerminator:
    ready = threading.Event()

    def handshake_error(loop, context):
      self.handshake_failures += 1  # a plain-TCP client at a TLS port: expected in tests

    async def serve():
      self.loop.set_exception_handler(handshake_error)
      self.server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, ssl=self.ctx)
      ready.set()
      with contextlib.suppress(asyncio.CancelledError):
        await self.server.serve_forever()

    self.thread = threading.Thread(
      target=lambda: self.loop.run_until_complete(serve()), daemon=True
    )
    self.thread.start()
    ready.wait(10)
    return self

  def __exit__(self, *exc):
    def stop():
      for task in asyncio.all_tasks(self.loop):
        task.cancel()

    self.loop.call_soon_threadsafe(stop)
    self.thread.join(10)
