"""The S3 store: a checkpoint root ``s3://bucket/prefix`` on S3 or a compatible server.

    <prefix>/exec/<attempt>/...   one execution's saves (a key prefix: S3 has no folders)
    <prefix>/pub/<name>           publications: zero-byte objects, PUT with If-None-Match: *
    <prefix>/sub/<NNNNNN>         submission numbers, the same conditional PUT
    <prefix>/events/<...>.jsonl   events, one object per event (S3 cannot append)

The POSIX store's protocol (protocol.py) with S3's primitives. The conditional PUT
(``If-None-Match: *``) is the O_EXCL create: of two writers of one key, one gets 200
and the other 412 Precondition Failed, on a server that checks and writes in one step
as S3 does (a 409 ConditionalRequestConflict means a concurrent write was in flight:
S3 asks for a retry, whose answer is then 200 or 412). A PUT that returned is durable
(S3 stores redundantly before it answers), so nothing is fsynced: not the save, whose
objects were durable when the framework's PUTs returned, nor the publication. The
listing is ListObjectsV2 paginated to the end. No lock, no pointer object, no
copy-then-delete. The server must honour If-None-Match on PUT (AWS S3 since 2024,
MinIO, Ceph RGW, R2); one that ignores it overwrites instead of refusing.

A save ``<root>/exec/<attempt>/checkpoint-5`` exists when the object of that key
exists (a file save) or at least one object lies under ``checkpoint-5/`` (a folder
save). There is no uid to check on S3: a root is as private as its bucket's policy.

Credentials and endpoint come from boto3's own chain (AWS_* variables, AWS_PROFILE and
~/.aws/config, SSO, instance metadata; AWS_ENDPOINT_URL_S3 or a profile's
endpoint_url), so what a site set up for the AWS CLI works here unchanged; boto3 is the
``s3`` extra, imported only when an s3:// root is used."""

import os
import time
from contextlib import contextmanager
from typing import Iterator, Optional

from ..contract import layout, names
from ..errors import BadPath, StoreError
from . import inventory
from .base import Store

KEY_MAX = 1024  # S3's limit on a key, in UTF-8 bytes
_CONFLICT_RETRIES = 5
_BATCH = 1000  # DeleteObjects' limit on keys per request
_sessions: list = []  # one boto3 session per process tree: a forked child reuses its loaded models
_clients: dict = {}
_HINTS = {
    "NoSuchBucket": "the bucket does not exist (create it first)",
    "AccessDenied": "access denied (check the credentials and the bucket's policy)",
    "InvalidAccessKeyId": "the access key is not known to this endpoint (check AWS_PROFILE / --endpoint-url)",
    "SignatureDoesNotMatch": "the secret key does not match (check the credentials)",
}


def client():
    """One boto3 S3 client per process and configuration (a forked child makes its own:
    a client's connections must not be shared across a fork)."""
    key = (os.getpid(), os.environ.get("AWS_ENDPOINT_URL_S3"), os.environ.get("AWS_ENDPOINT_URL"),
           os.environ.get("AWS_PROFILE"))
    c = _clients.get(key)
    if c is None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise StoreError("an s3:// root needs boto3: pip install 'dispatch-slurm[s3]'") from None
        with errors("S3"):
            if not _sessions or _sessions[0][0] != key[1:]:
                _sessions[:] = [(key[1:], boto3.session.Session())]
            c = _sessions[0][1].client("s3", config=Config(retries={"mode": "standard"}))
        _clients[key] = c
    return c


@contextmanager
def errors(where: str) -> Iterator[None]:
    """Turn boto3's exceptions into one-line StoreErrors naming ``where`` and the fix."""
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
    try:
        yield
    except NoCredentialsError:
        raise StoreError(f"{where}: no AWS credentials (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                         "or AWS_PROFILE)") from None
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "?")
        raise StoreError(f"{where}: {_HINTS.get(code) or code} ({e.response.get('Error', {}).get('Message', '')})"
                         ) from None
    except BotoCoreError as e:
        raise StoreError(f"{where}: {e}") from None


def _status(e) -> int:
    return e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)


def split(root) -> tuple[str, str]:
    """(bucket, key prefix) of a root; the prefix is '' or ends in '/'."""
    return names.split_s3(os.fspath(root))


def _pages(bucket: str, prefix: str, where: str, **kw) -> Iterator[dict]:
    """Every page of ListObjectsV2 under ``prefix``, to the end (boto3 decodes the
    url-encoded keys it asks for)."""
    c, kw = client(), {"Bucket": bucket, "Prefix": prefix, **kw}
    with errors(where):
        while True:
            page = c.list_objects_v2(**kw)
            yield page
            if not page.get("IsTruncated"):
                return
            if not page.get("NextContinuationToken"):
                raise StoreError(f"{where}: a truncated listing without a continuation token (a server bug)")
            kw["ContinuationToken"] = page["NextContinuationToken"]


def walk(root, folder: str) -> Iterator[tuple[str, dict]]:
    """(name, the listing's entry: Key, LastModified, Size...) of every object under
    ``<root>/<folder>/``; the name is the key less that prefix, '/' and all."""
    bucket, prefix = split(root)
    start = len(f"{prefix}{folder}/")
    for page in _pages(bucket, f"{prefix}{folder}/", f"{root}/{folder}"):
        for o in page.get("Contents", ()):
            yield o["Key"][start:], o


def list_names(root, folder: str) -> list[str]:
    """The names under ``<root>/<folder>/`` (every key: a key that does not parse must
    be seen to be refused)."""
    return [name for name, _ in walk(root, folder)]


def create_new(bucket: str, key: str, where: str, body: bytes = b"") -> bool:
    """PUT ``key`` only if absent (If-None-Match: *); True if created now, False if it
    existed (412). A 409 (a concurrent conditional write in flight) is retried, as S3
    asks. Durable on return."""
    from botocore.exceptions import ClientError
    c = client()
    for _ in range(_CONFLICT_RETRIES):
        with errors(where):
            try:
                c.put_object(Bucket=bucket, Key=key, Body=body, IfNoneMatch="*")
                return True
            except ClientError as e:
                if _status(e) == 412:
                    return False
                if _status(e) != 409:
                    raise
    raise StoreError(f"{where}: {key} kept conflicting with concurrent writes ({_CONFLICT_RETRIES} tries)")


def exists(bucket: str, key: str, where: str) -> bool:
    """A folder save (an object under ``key/``) or a file save (the object ``key``)."""
    from botocore.exceptions import ClientError
    c = client()
    with errors(where):
        if c.list_objects_v2(Bucket=bucket, Prefix=f"{key}/", MaxKeys=1).get("KeyCount", 0):
            return True
        try:
            c.head_object(Bucket=bucket, Key=key)
            return True
        except ClientError as e:
            if _status(e) == 404:
                return False
            raise


def read(url: str) -> bytes | None:
    """The content of the object ``url`` (s3://bucket/key), or None if it does not exist."""
    from botocore.exceptions import ClientError
    bucket, key = split(url)
    with errors(url):
        try:
            return client().get_object(Bucket=bucket, Key=key.rstrip("/"))["Body"].read()
        except ClientError as e:
            if _status(e) == 404:
                return None
            raise


def reachable(root) -> None:
    """Ask the bucket once (one key listed): a missing bucket or a credential problem is
    an error naming it, never taken for a missing object."""
    bucket, prefix = split(root)
    next(_pages(bucket, prefix, str(root), MaxKeys=1))


def present(url: str) -> bool:
    """Whether a save (an object, or objects under it) is at ``url``."""
    bucket, key = split(url)
    return exists(bucket, key.rstrip("/"), url)


def stat(url: str) -> dict | None:
    """The listing's entry (Key, Size, LastModified...) of the object ``url`` itself, or
    None if there is no such object."""
    bucket, key = split(url)
    key = key.rstrip("/")
    page = next(_pages(bucket, key, url, MaxKeys=1))
    return next((o for o in page.get("Contents", ()) if o["Key"] == key), None)


def object_exists(url: str) -> bool:
    """Whether the object ``url`` itself exists (a marker)."""
    from botocore.exceptions import ClientError
    bucket, key = split(url)
    with errors(url):
        try:
            client().head_object(Bucket=bucket, Key=key.rstrip("/"))
            return True
        except ClientError as e:
            if _status(e) == 404:
                return False
            raise


def delete(bucket: str, keys: list[str], where: str) -> None:
    """DeleteObjects, ``_BATCH`` keys a request; a key S3 could not delete is an error."""
    c = client()
    for i in range(0, len(keys), _BATCH):
        with errors(where):
            out = c.delete_objects(Bucket=bucket, Delete={"Objects": [{"Key": k} for k in keys[i:i + _BATCH]],
                                                          "Quiet": True})
        if out.get("Errors"):
            e = out["Errors"][0]
            raise StoreError(f"{where}: {len(out['Errors'])} object(s) not deleted, e.g. {e.get('Key')}: "
                             f"{e.get('Code')} ({e.get('Message', '')})")


def entries(folder_url: str) -> Iterator[tuple[str, bool]]:
    """(name, is a folder) of each entry one level under ``folder_url``."""
    bucket, prefix = split(folder_url)
    for page in _pages(bucket, prefix, folder_url, Delimiter="/"):
        for p in page.get("CommonPrefixes", ()):
            yield p["Prefix"][len(prefix):-1], True
        for o in page.get("Contents", ()):
            yield o["Key"][len(prefix):], False


def _folders(root: str) -> tuple[dict[str, inventory.Folder], dict[str, int]]:
    """Every execution's folder (a prefix exec/<attempt>/) from one listing of exec/, with
    LastModified for its times and the names one level under it; and the bytes stored
    under every prefix below exec/ (a save's size)."""
    folders: dict[str, inventory.Folder] = {}
    size: dict[str, int] = {}
    for name, o in walk(root, layout.EXEC):
        parts = name.split("/")
        for i in range(2, len(parts) + 1):
            rel = "/".join([layout.EXEC, *parts[:i]])
            size[rel] = size.get(rel, 0) + o["Size"]
        if len(parts) < 2:
            continue  # an object right under exec/: not an execution's folder
        f = folders.setdefault(parts[0], inventory.Folder())
        t = o["LastModified"].timestamp()
        f.first, f.last = min(f.first or t, t), max(f.last or t, t)
        f.newest = max(f.newest, t)
        f.entries[parts[1]] = f.entries.get(parts[1], False) or len(parts) > 2
    return folders, size


class S3Store(Store):
    """A root ``s3://bucket/prefix`` (see the module doc)."""

    kind = "s3://"
    mv = "aws s3 mv"

    def __init__(self, root: str):
        super().__init__(names.normalize_root(os.fspath(root)))
        self.bucket, self.prefix = split(self.root)

    @classmethod
    def absolute(cls, value: str, from_env: bool) -> str:
        return names.normalize_root(value)  # checked, never rewritten into another prefix

    def _key(self, folder: str, name: str) -> str:
        return f"{self.prefix}{folder}/{name}"

    def warm(self) -> None:
        client()

    def reachable(self) -> None:
        reachable(self.root)

    # -- entries of protocol folders ----------------------------------------------------

    def listing(self, folder: str) -> list[str]:
        return list_names(self.root, folder)

    def read(self, folder: str, name: str, limit: Optional[int] = 1 << 20) -> Optional[bytes]:
        data = read(self.where(folder, name))
        return data if data is None or limit is None else data[:limit]

    def has(self, folder: str, name: str) -> bool:
        return object_exists(self.where(folder, name))

    def create(self, folder: str, name: str, body: bytes = b"", mode: int = 0o444, sync_root: bool = True) -> bool:
        return create_new(self.bucket, self._key(folder, name), self.where(folder), body)

    def delete(self, folder: str, name: str) -> bool:
        url = self.where(folder, name)
        if not object_exists(url):
            return False
        delete(self.bucket, [self._key(folder, name)], url)
        return True

    def fill_empty(self, folder: str, name: str, body: bytes) -> bytes:
        """Only a person's retire writes content, and gc's conditional PUT of an existing
        marker changes nothing: a plain PUT over an empty marker is safe."""
        url = self.where(folder, name)
        old = read(url)
        if old:
            return old
        with errors(url):
            client().put_object(Bucket=self.bucket, Key=self._key(folder, name), Body=body)
        return b""

    def too_long(self, folder: str, name: str) -> Optional[str]:
        if len(self._key(folder, name).encode()) > KEY_MAX:
            return f"its {folder}/ key would be over S3's limit of {KEY_MAX} bytes: left alone"
        return None

    # -- saves and publications ---------------------------------------------------------

    def save_relpath(self, save) -> str:
        """The save's path under the root: it must be a URL under the root and exist."""
        rel = self.relpath(save)
        if not self.save_exists(rel):
            raise BadPath(f"save {os.fspath(save).rstrip('/')} does not exist (no object at or under it)")
        return rel

    def relpath(self, save) -> str:
        save = os.fspath(save).rstrip("/")
        if not save.startswith(f"{self.root}/"):
            raise BadPath(f"save {save} is not inside the checkpoint root {self.root}")
        return names.check_relpath(save[len(self.root) + 1:])

    def save_exists(self, rel: str) -> bool:
        return present(f"{self.root}/{rel}")

    def publication_fits(self, name: str, rel: str) -> None:
        """The publication's key, refused over S3's key limit before anything is created."""
        size = len(self._key(layout.PUB, name).encode())
        if size > KEY_MAX:
            raise BadPath(f"publication key for {rel!r} is {size} bytes, over S3's limit of {KEY_MAX}: "
                          "use a shorter root prefix or save path")

    def create_publication(self, name: str) -> bool:
        return self.create(layout.PUB, name)

    def make_exec_dir(self, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
        """A prefix, so nothing is created; the bucket is asked once, so a missing bucket or
        a credential problem stops the job script here, not at its first save. ``mode`` and
        ``create_root`` have no meaning on S3."""
        self.check_attempt(attempt)
        self.reachable()
        return f"{self.root}/{layout.exec_relpath(attempt)}"

    # -- events: one object per event (S3 cannot append) ----------------------------------

    def add_event(self, name: str, line: bytes) -> None:
        with errors(self.where(layout.EVENTS)):
            client().put_object(Bucket=self.bucket, Key=self._key(layout.EVENTS, f"{name}.{time.time_ns()}.jsonl"),
                                Body=line)

    def event_files(self, prefix: str = "") -> list[tuple[str, bytes]]:
        return [(name, read(self.where(layout.EVENTS, name)) or b"")
                for name in sorted(self.listing(layout.EVENTS)) if name.startswith(prefix)]

    # -- gc ------------------------------------------------------------------------------

    def inventory(self, pattern: str = names.STEP_PATTERN) -> inventory.Inventory:
        """One listing each of pub/, retired/, pinned/ and exec/ (paginated to the end): a
        save's size is the sum of its objects' sizes, an execution's newest write the newest
        LastModified under exec/<attempt>/, a leftover an entry one level under it, named
        like a save, with objects under it (a folder save)."""
        pubs = self.publications()
        listed = list(walk(self.root, layout.RETIRED))
        folders, size = _folders(self.root)
        inv = self.finish_inventory(pubs, [n for n, _ in listed], folders, pattern, self._by_person(listed))
        for s in inv.saves.values():
            if s.path in size:
                s.size, s.exists = size[s.path], True
            elif s.attempt is None:  # outside exec/: gc keeps it; measured for --keep-last's count
                s.exists = present(f"{self.root}/{s.path}")
        self.check_problems(inv)
        return inv

    def _by_person(self, listed: list[tuple[str, dict]]) -> dict[str, dict]:
        """gc's markers are empty: only the others are read."""
        return super().by_person([name for name, o in listed if o["Size"]])

    def retired_state(self) -> tuple[set[str], dict[str, dict]]:
        listed = list(walk(self.root, layout.RETIRED))  # one listing: names and sizes
        return {name for name, _ in listed}, self._by_person(listed)

    def by_person(self, marks: list[str]) -> dict[str, dict]:
        wanted = set(marks)
        return self._by_person([(n, o) for n, o in walk(self.root, layout.RETIRED) if n in wanted])

    def remove(self, rel: str, held: tuple[str, ...] = ()) -> int:
        """Delete every object of the save (under ``rel/``, and ``rel`` itself: a file save)."""
        url = f"{self.root}/{rel}"
        objs = [o for _, o in walk(self.root, rel)] + [o for o in [stat(url)] if o]
        delete(self.bucket, [o["Key"] for o in objs], url)
        return sum(o["Size"] for o in objs)

    # -- an execution's prefix, as watch reads it ---------------------------------------

    def entries(self, folder: str) -> Iterator[tuple[str, bool]]:
        return entries(folder)

    def exists(self, path: str) -> bool:
        return object_exists(path)

    def read_path(self, path: str) -> Optional[bytes]:
        return read(path)

    def present(self, path: str) -> bool:
        return present(path)
