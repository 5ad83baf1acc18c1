"""Is a file of a save whole? Checked at publication, so a torn save is never published.

A trainer that writes its completeness marker before its weights (or a watch that sees
a marker while the weights are still being written) would otherwise publish a save that
no resume can load: ``torch.load`` stops with "PytorchStreamReader failed finding central
directory", and every later execution crashes on the same latest save. Two formats can
be told whole from their own structure, cheaply (a few reads at the file's ends, nothing
proportional to its size):

* a zip archive named as one (``torch.save``'s format since 1.6 in a ``.pt``, ``.pth``,
  ``.bin`` or ``.ckpt`` file, ``.npz``, ``.zip``) that starts with ``PK\\x03\\x04``: whole
  when its end-of-central-directory record ends the file (with its comment) and the
  central directory it points to starts with its signature, through the zip64 locator and
  record where the archive uses them (torch.save always does);
* a ``.safetensors`` file: whole when its length is exactly 8 + the header's length + the
  end of the last tensor the header lists.

Any other file (a legacy pickle, a JSON file, a DCP shard: ``.distcp`` files are
``torch.save`` archives written one after another, so the last one's end record does not
describe the file) cannot be told whole from its bytes: its writer's order (a marker written last, ``.metadata`` last) is what vouches for it.
An empty file named like a checkpoint (``.pt``, ``.pth``, ``.ckpt``, ``.bin``,
``.safetensors``) is torn: no such format is empty."""

from __future__ import annotations

import json
import os
import struct
from typing import Optional

ZIP_LOCAL = b"PK\x03\x04"
_EOCD, _CD = b"PK\x05\x06", b"PK\x01\x02"
_Z64_LOCATOR, _Z64_EOCD = b"PK\x06\x07", b"PK\x06\x06"
_EOCD_MIN, _COMMENT_MAX = 22, 0xFFFF
_SAFETENSORS_HEADER_MAX = 100 * 1024 * 1024  # safetensors' own limit on the header
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".safetensors")
ZIP_SUFFIXES = (".pt", ".pth", ".ckpt", ".bin", ".npz", ".zip")  # one archive per file


def _read(fd: int, offset: int, n: int) -> bytes:
    """``n`` bytes at ``offset`` (fewer only at the end of the file)."""
    out = b""
    while len(out) < n:
        chunk = os.pread(fd, n - len(out), offset + len(out))
        if not chunk:
            break
        out += chunk
    return out


def _eocd(tail: bytes) -> int:
    """Where the end-of-central-directory record starts in ``tail`` (the file's last bytes),
    -1 if none: the last signature whose record and comment end exactly at the file's end."""
    at = tail.rfind(_EOCD)
    while at >= 0:
        if at + _EOCD_MIN <= len(tail) and at + _EOCD_MIN + struct.unpack_from("<H", tail, at + 20)[0] == len(tail):
            return at
        at = tail.rfind(_EOCD, 0, at)
    return -1


def zip_problem(fd: int, size: int) -> Optional[str]:
    """Why the zip archive in ``fd`` (``size`` bytes) is not whole, or None."""
    tail_len = min(size, _EOCD_MIN)  # no archive comment (torch.save writes none): one small read
    tail = _read(fd, size - tail_len, tail_len)
    at = _eocd(tail)
    if at < 0 and size > _EOCD_MIN:  # a comment, or no end record: look through the longest comment
        tail_len = min(size, _EOCD_MIN + _COMMENT_MAX)
        tail = _read(fd, size - tail_len, tail_len)
        at = _eocd(tail)
    if at < 0:
        return "a zip archive without its end of central directory (cut short: still being written, or torn)"
    eocd = size - tail_len + at
    entries, cd_size, cd_offset = struct.unpack_from("<HII", tail, at + 10)
    end = eocd
    loc = _read(fd, eocd - 20, 20) if eocd >= 20 else b""
    if loc[:4] == _Z64_LOCATOR:  # zip64: the real values are in the zip64 record
        z64 = struct.unpack_from("<Q", loc, 8)[0]
        rec = _read(fd, z64, 56) if z64 + 56 <= eocd - 20 else b""
        if len(rec) != 56 or rec[:4] != _Z64_EOCD:
            return "a zip64 archive whose zip64 end-of-central-directory record is missing (torn)"
        entries, cd_size, cd_offset = struct.unpack_from("<QQQ", rec, 32)
        end = z64
    elif 0xFFFF == entries or 0xFFFFFFFF in (cd_size, cd_offset):
        return "a zip64 archive without its zip64 end-of-central-directory locator (torn)"
    if cd_offset + cd_size > end:
        return "a zip archive whose central directory lies past its end (torn)"
    if entries and _read(fd, cd_offset, 4) != _CD:
        return "a zip archive whose central directory is not where its end record says (torn)"
    return None


def safetensors_problem(fd: int, size: int) -> Optional[str]:
    """Why the safetensors file in ``fd`` is not whole, or None."""
    if size < 8:
        return f"a safetensors file of {size} bytes, shorter than its 8-byte header length (torn)"
    n = struct.unpack("<Q", _read(fd, 0, 8))[0]
    if n > _SAFETENSORS_HEADER_MAX or 8 + n > size:
        return f"a safetensors file of {size} bytes whose header says it is {n} bytes long (torn)"
    try:
        header = json.loads(_read(fd, 8, n))
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return "a safetensors file whose header does not parse (torn)"
    want = 8 + n + max(ends, default=0)
    if want != size:
        return f"a safetensors file of {size} bytes whose header says {want} (torn)"
    return None


def problem(name: str, fd: int) -> Optional[str]:
    """Why the regular file ``name`` open in ``fd`` is not whole, or None when it is whole
    or its format cannot tell."""
    size = os.fstat(fd).st_size
    lower = name.lower()
    if size == 0:
        return "an empty file, which no checkpoint format is (torn)" if lower.endswith(CHECKPOINT_SUFFIXES) else None
    if lower.endswith(".safetensors"):
        return safetensors_problem(fd, size)
    if not lower.endswith(ZIP_SUFFIXES):
        return None
    head = _read(fd, 0, len(ZIP_LOCAL))
    if head == ZIP_LOCAL:
        return zip_problem(fd, size)
    if size < len(ZIP_LOCAL) and ZIP_LOCAL.startswith(head):
        return f"the first {size} bytes of a zip archive (torn)"
    return None
