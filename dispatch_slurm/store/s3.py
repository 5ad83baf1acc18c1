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
from contextlib import contextmanager
from typing import Iterator

from ..contract import layout, names
from ..contract.names import Publication
from ..errors import BadPath, StoreError
from . import protocol

KEY_MAX = 1024  # S3's limit on a key, in UTF-8 bytes
_CONFLICT_RETRIES = 5
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


# --- the store's entry points, as posix.py has them ---

def publications(root) -> list[Publication]:
    return protocol.publications(list_names(root, layout.PUB), f"{root}/{layout.PUB}")


def latest(root) -> Publication | None:
    """As posix.latest (protocol.latest): one GET of the greatest name's retired/ marker."""
    return protocol.latest(list_names(root, layout.PUB), root, lambda name: read(f"{root}/{layout.RETIRED}/{name}"),
                           lambda: list_names(root, layout.RETIRED))


def allocate_submission(root) -> int:
    """The next N under ``sub/``: max+1, created if absent, else the next (protocol.py)."""
    bucket, prefix = split(root)
    where = f"{root}/{layout.SUB}"
    return protocol.allocate(list_names(root, layout.SUB),
                             lambda name: create_new(bucket, f"{prefix}{layout.SUB}/{name}", where), where)


def make_exec_dir(root, attempt: str, mode: int = 0o700, create_root: bool = False) -> str:
    """``<root>/exec/<attempt>``: a prefix, so nothing is created; the bucket is asked
    once, so a missing bucket or a credential problem stops the job script here, not
    at its first save. ``mode`` and ``create_root`` have no meaning on S3."""
    if not attempt or "/" in attempt or attempt in (".", ".."):
        raise BadPath(f"attempt token {attempt!r} is not a single path component")
    reachable(root)
    return f"{root}/{layout.exec_relpath(attempt)}"


def reachable(root) -> None:
    """Ask the bucket once (one key listed): a missing bucket or a credential problem is
    an error naming it, never taken for a missing object."""
    bucket, prefix = split(root)
    next(_pages(bucket, prefix, str(root), MaxKeys=1))


def present(url: str) -> bool:
    """Whether a save (an object, or objects under it) is at ``url``."""
    bucket, key = split(url)
    return exists(bucket, key.rstrip("/"), url)


def save_exists(root, rel: str) -> bool:
    return present(f"{root}/{rel}")


# --- what publish.py needs: the save, the name's fit, the create ---

def save_relpath(root: str, save) -> str:
    """The save's path under the root: it must be a URL under the root and exist."""
    save = os.fspath(save).rstrip("/")
    if not save.startswith(f"{root}/"):
        raise BadPath(f"save {save} is not inside the checkpoint root {root}")
    rel = names.check_relpath(save[len(root) + 1:])
    if not save_exists(root, rel):
        raise BadPath(f"save {save} does not exist (no object at or under it)")
    return rel


def pub_key(root: str, name: str, rel: str) -> str:
    """The publication's key, refused over S3's key limit before anything is created."""
    key = f"{split(root)[1]}{layout.PUB}/{name}"
    size = len(key.encode())
    if size > KEY_MAX:
        raise BadPath(f"publication key for {rel!r} is {size} bytes, over S3's limit of {KEY_MAX}: "
                      "use a shorter root prefix or save path")
    return key


def create_publication(root: str, key: str) -> bool:
    return create_new(split(root)[0], key, f"{root}/{layout.PUB}")


# --- events: one object per event ---

def put_event(root: str, name: str, data: bytes) -> None:
    bucket, prefix = split(root)
    with errors(f"{root}/{layout.EVENTS}"):
        client().put_object(Bucket=bucket, Key=f"{prefix}{layout.EVENTS}/{name}", Body=data)


def event_objects(root: str) -> Iterator[tuple[str, bytes]]:
    """(name, content) of every event object, in name order."""
    for name in sorted(list_names(root, layout.EVENTS)):
        yield name, read(f"{root}/{layout.EVENTS}/{name}") or b""


# --- what watch needs: one level of a folder, and an object's presence or content ---

def entries(folder_url: str) -> Iterator[tuple[str, bool]]:
    """(name, is a folder) of each entry one level under ``folder_url``."""
    bucket, prefix = split(folder_url)
    for page in _pages(bucket, prefix, folder_url, Delimiter="/"):
        for p in page.get("CommonPrefixes", ()):
            yield p["Prefix"][len(prefix):-1], True
        for o in page.get("Contents", ()):
            yield o["Key"][len(prefix):], False


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
