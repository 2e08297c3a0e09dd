"""Where a run keeps what other machines must read: a local directory, or a bucket.

`open_store(location)` gives a small view of one directory, or of one prefix of a bucket
(`s3://BUCKET/PREFIX`, `gs://BUCKET/PREFIX`), as whole objects by name: read, write, delete,
list. Both kinds keep the one promise the parameter channel and the snapshot mirror build on:
a reader sees an object whole or not at all. A directory gets it from write-to-temp and
atomic rename; a bucket from the object store itself (a PUT replaces an object at once, and
S3 and GCS read after write consistently), so writing the data first and a small pointer or
marker object last gives the same "never half a version" as renaming does on a disk.

Buckets go through TensorStore's key-value stores (its `s3` and `gcs` drivers), the I/O
library Orbax itself writes arrays with: no second storage client. Credentials and the
endpoint come only from the environment, never from a config (which is written into
`config.json` and announced to samplers): for S3 `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY` (and `AWS_SESSION_TOKEN`), else the AWS default chain (profile,
instance metadata); `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` for an S3-compatible
service other than AWS (MinIO, Ceph, a local test endpoint); `AWS_REGION` or
`AWS_DEFAULT_REGION`. For GCS, Google's application default credentials.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile

REMOTE_SCHEMES = ("s3://", "gs://")


class StoreError(OSError):
  """A bucket request that failed (unreachable endpoint, refused credentials, no bucket)."""


def is_remote(location: str | os.PathLike) -> bool:
  """True for a bucket URL (`s3://`, `gs://`), False for a local path."""
  return str(location).startswith(REMOTE_SCHEMES)


def url_problem(url: str) -> str | None:
  """Why `url` is not a bucket location this module can use, or None if it is."""
  if not is_remote(url):
    return f"{url!r} is not an s3:// or gs:// URL"
  bucket = url.split("://", 1)[1].split("/", 1)[0]
  if not bucket:
    return f"{url!r} names no bucket"
  if "@" in bucket or ":" in bucket:
    return f"{url!r}: credentials and endpoints come from the environment, not the URL"
  if any(c in url for c in "?#"):
    return f"{url!r}: a bucket and a key prefix only"
  return None


def join(location: str | os.PathLike, *names: str) -> str | pathlib.Path:
  """`location/name/...`: a URL stays a string, a local path a Path."""
  if is_remote(location):
    return "/".join([str(location).rstrip("/"), *(n.strip("/") for n in names)])
  return pathlib.Path(location).joinpath(*names)


def kvstore_spec(url: str) -> dict:
  """The TensorStore key-value store spec of a bucket prefix, completed from the
  environment (see the module docstring)."""
  problem = url_problem(url)
  if problem:
    raise ValueError(problem)
  scheme, rest = url.split("://", 1)
  bucket, _, prefix = rest.partition("/")
  prefix = prefix.strip("/")
  spec = {"bucket": bucket, "path": f"{prefix}/" if prefix else ""}
  if scheme == "gs":
    return {"driver": "gcs", **spec}
  spec["driver"] = "s3"
  env = os.environ
  endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL")
  region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
  if endpoint:
    spec["endpoint"] = endpoint
    region = region or "us-east-1"  # (else TensorStore asks AWS where the bucket is)
  if region:
    spec["aws_region"] = region
  if env.get("AWS_ACCESS_KEY_ID"):
    spec["aws_credentials"] = {"type": "environment"}
  return spec


class LocalStore:
  """A directory: objects are its files (names may contain '/': subdirectories)."""

  remote = False

  def __init__(self, directory: str | os.PathLike):
    self.dir = pathlib.Path(directory)

  def __str__(self) -> str:
    return str(self.dir)

  def where(self, name: str) -> str:
    return str(self.dir / name)

  def ensure(self) -> None:
    self.dir.mkdir(parents=True, exist_ok=True)

  def read(self, name: str) -> bytes:
    return (self.dir / name).read_bytes()

  def write(self, name: str, data: bytes) -> None:
    """Write to a temporary file beside it, then rename: readers see the old or the new."""
    path = self.dir / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
      with os.fdopen(fd, "wb") as f:
        f.write(data)
      os.replace(tmp, path)
    except BaseException:
      # (an interrupt may land after the rename: then there is nothing left to remove)
      with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
      raise

  def delete(self, name: str) -> None:
    (self.dir / name).unlink(missing_ok=True)

  def list(self, prefix: str = "") -> list[str]:
    if not self.dir.is_dir():
      return []
    names = (p.relative_to(self.dir).as_posix() for p in self.dir.rglob("*") if p.is_file())
    return sorted(n for n in names if n.startswith(prefix))

  def clear(self) -> None:
    import shutil

    shutil.rmtree(self.dir, ignore_errors=True)


class BucketStore:
  """A prefix of an S3 or GCS bucket, through TensorStore. Every call completes (or raises)
  before it returns; failures are `StoreError`s naming the URL (a missing object on read:
  FileNotFoundError, as for a file)."""

  remote = True

  def __init__(self, url: str):
    import tensorstore as ts

    self.url = url.rstrip("/")
    self._ts = ts
    spec = kvstore_spec(self.url)
    # A few quick retries, not TensorStore's default 32 with backoff to 32 s: an unreachable
    # endpoint is an error within about 10 s, not many minutes of silence.
    retries = {"max_retries": 6, "initial_delay": "0.2s", "max_delay": "4s"}
    context = ts.Context({f"{spec['driver']}_request_retries": retries})
    try:
      self._kv = ts.KvStore.open(spec, context=context).result()
    except ValueError as err:
      raise StoreError(f"cannot open {self.url}: {err}") from None

  def __str__(self) -> str:
    return self.url

  def where(self, name: str) -> str:
    return f"{self.url}/{name}"

  def ensure(self) -> None:
    pass  # a bucket has no directories to make; the bucket itself must exist

  def read(self, name: str) -> bytes:
    got = self._call(self._kv.read(name), name)
    if got.state != "value":
      raise FileNotFoundError(self.where(name))
    return bytes(got.value)

  def write(self, name: str, data: bytes) -> None:
    """One PUT: the object is replaced whole (readers see the old or the new)."""
    self._call(self._kv.write(name, data), name)

  def delete(self, name: str) -> None:
    self._call(self._kv.write(name, None), name)

  def list(self, prefix: str = "") -> list[str]:
    keys = self._call(self._kv.list(self._range(prefix)), prefix)
    return sorted(k.decode() for k in keys)

  def clear(self) -> None:
    self._call(self._kv.delete_range(self._range("")), "")

  def _range(self, prefix: str):
    if not prefix:
      return self._ts.KvStore.KeyRange()
    end = prefix[:-1] + chr(ord(prefix[-1]) + 1)  # the first key past every `prefix...`
    return self._ts.KvStore.KeyRange(inclusive_min=prefix, exclusive_max=end)

  def _call(self, future, name: str):
    try:
      return future.result()
    except ValueError as err:  # TensorStore's error for HTTP and credential failures
      raise StoreError(f"{self.where(name)}: {err}") from None


def open_store(location: str | os.PathLike) -> LocalStore | BucketStore:
  """The store of a local directory or a bucket URL."""
  return BucketStore(str(location)) if is_remote(location) else LocalStore(location)
