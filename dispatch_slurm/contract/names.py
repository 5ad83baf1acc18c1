"""Every name of the on-disk contract, as pure functions (no I/O).

Publication: ``<epoch, 20 digits>-<step, 20 digits>-<path under the root, base32>``.
Base32 (RFC 4648, A-Z2-7, no padding) has one case, so a case-folding filesystem
cannot merge two names, and no '-', so the name splits one way only. The fixed-width
digits make the name's string order equal to (epoch, step) order; the whole name
breaks ties, so every reader picks the same latest entry.
"""

import base64
import os
import re
from functools import lru_cache
from itertools import chain, repeat
from operator import itemgetter, mod
from typing import NamedTuple

from ..errors import BadName, BadPath, DispatchError, EnvError
from . import layout
from .epoch import EPOCH_MAX, Epoch, decompose

#: the greatest step: a signed 64-bit integer's, which every framework counts steps in (torch's
#: int64, numpy, C); a step past it is a typo or a forged entry, never a trainer's, and would
#: outrank every later save of its epoch (the name keeps its 20 digits)
STEP_MAX = 2**63 - 1
#: a save's name and its step: ``checkpoint-<step>``, the Hugging Face Trainer's, which
#: watch, publish, the integrations and the trial trainer all use unless told otherwise
STEP_PATTERN = r"checkpoint-([0-9]+)"
#: what ``dispatch_slurm.saving`` writes a save under before renaming it to ``checkpoint-<step>``:
#: a name no save pattern matches, so a kill inside the block leaves nothing taken for a save; the
#: inventory still finds it, so the report names it and gc reclaims it once its execution ceased
SAVING_PATTERN = r"\.checkpoint-([0-9]+)\.saving-[0-9]+-[0-9a-f]+"


def saving_name(step: int, pid: int, token: str) -> str:
    """The hidden name of a save being written by ``saving()`` (SAVING_PATTERN)."""
    return f".checkpoint-{step}.saving-{pid}-{token}"
#: the file ``dispatch_slurm.saving`` writes into a save before the save gets its name: watch
#: takes a save holding it as complete, whatever marker it waits for otherwise
COMPLETE_MARKER = ".dispatch-complete"
_B32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"
# base32 -> the digits int(x, 32) reads, so decoding runs in C, not in a Python loop
_TO_INT32 = str.maketrans(_B32, "0123456789abcdefghijklmnopqrstuv")
_PUB_RE = re.compile(r"([0-9]{20})-([0-9]{20})-([A-Z2-7]+)")
_SUB_RE = re.compile(r"[0-9]{6}")
_CLAIM_RE = re.compile(rb"[A-Za-z0-9_-]{1,64}\.[0-9]{1,20}\.([0-9]{1,20})\n")
_TOKEN_SAFE = re.compile(r"[^A-Za-z0-9_-]")
_DEC = re.compile(r"[0-9]+")
S3_SCHEME = "s3://"
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
# unpadded base32 length mod 8 -> number of zero bits in the last character
_PAD_BITS = {0: 0, 2: 2, 4: 4, 5: 1, 7: 3}


class Publication(NamedTuple):
    epoch: int
    step: int
    path: str  # the save, relative to the root, canonical
    name: str  # the entry in pub/

    @property
    def parts(self) -> Epoch:
        return decompose(self.epoch)


def b32encode(data: bytes) -> str:
    """Base32 codes each 5-byte block alone, and a save's folders (``exec/<attempt>/``) repeat
    from one publication to the next: their whole blocks are coded once per process."""
    cut = data.rfind(b"/") + 1
    cut -= cut % 5
    return _b32_blocks(data[:cut]) + base64.b32encode(data[cut:]).decode("ascii").rstrip("=")


@lru_cache(maxsize=64)
def _b32_blocks(blocks: bytes) -> str:
    return base64.b32encode(blocks).decode("ascii")


def b32decode(text: str) -> bytes:
    """Strict, canonical decode: only A-Z2-7, a valid unpadded length, zero tail bits."""
    if not text or text.strip(_B32):
        raise ValueError("not base32 (A-Z2-7)")
    pad = _PAD_BITS.get(len(text) % 8)
    if pad is None:
        raise ValueError(f"base32 length {len(text)} is impossible without padding")
    value = int(text.translate(_TO_INT32), 32)
    if value & ((1 << pad) - 1):
        raise ValueError("base32 has non-zero trailing bits (not canonical)")
    return (value >> pad).to_bytes(len(text) * 5 // 8, "big")


def check_relpath(path: str) -> str:
    """Refuse a save path that is absolute, has '..', or is not canonical.

    Canonical (no '', '.', '..' component, no trailing '/') means one save has one
    name, and a relative path without '..' cannot leave the root lexically."""
    if not path:
        raise BadPath("save path is empty")
    if "\0" in path:
        raise BadPath(f"save path {path!r} contains a NUL byte")
    if path.startswith("/"):
        raise BadPath(f"save path {path!r} is absolute; it must be relative to the root")
    for part in path.split("/"):
        if part == "..":
            raise BadPath(f"save path {path!r} contains '..' and could leave the root")
        if part in ("", "."):
            raise BadPath(f"save path {path!r} is not canonical (empty or '.' component)")
    return path


def _digits(what: str, value: int, hi: int) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= hi:
        raise BadName(str(value), f"{what} must be an integer 0..{hi}")
    return f"{value:020d}"


def encode(epoch: int, step: int, path: str) -> str:
    """The publication name of a save at `path` (relative to the root)."""
    decompose(epoch)  # refuses epochs no (G, N, R) composes
    e, s = _digits("epoch", epoch, EPOCH_MAX), _digits("step", step, STEP_MAX)
    return f"{e}-{s}-{b32encode(os.fsencode(check_relpath(path)))}"


def parse(name: str, where: str | None = None) -> Publication:
    """Parse a publication name strictly; a bad name raises BadName naming it."""
    m = _PUB_RE.fullmatch(name)
    if m is None:
        raise BadName(name, "not <20-digit epoch>-<20-digit step>-<base32 path>", where)
    try:
        epoch, step = int(m[1]), int(m[2])
        decompose(epoch)
        if step > STEP_MAX:
            raise ValueError(f"step {step} is out of range 0..{STEP_MAX}")
        path = check_relpath(os.fsdecode(b32decode(m[3])))
    except (ValueError, BadPath) as e:
        raise BadName(name, str(e), where) from None
    return Publication(epoch, step, path, name)


def path_name(path: str) -> str:
    """An entry naming a save by its path alone (``pinned/``): the path part of a
    publication name, so the same paths fit and the same decoder reads it."""
    return b32encode(os.fsencode(check_relpath(path)))


def parse_path_name(name: str, where: str | None = None) -> str:
    """The save path a ``path_name`` entry names; a bad name raises BadName naming it."""
    try:
        return check_relpath(os.fsdecode(b32decode(name)))
    except (ValueError, BadPath) as e:
        raise BadName(name, f"not a base32 save path ({e})", where) from None


def submission_name(n: int) -> str:
    return f"{n:06d}"


def parse_submission(name: str, where: str | None = None) -> int:
    if _SUB_RE.fullmatch(name) is None or name == "000000":
        raise BadName(name, "not a 6-digit submission number 000001..999999", where)
    return int(name)


def claim_name(epoch: int) -> str:
    """The claim of an epoch, ``epochs/<epoch, 20 digits>``: the digits of a publication name."""
    decompose(epoch)
    return _digits("epoch", epoch, EPOCH_MAX)


CLAIM_MAX = 4096  # a claim is one token and a newline; more is not a claim


def claim_content(attempt: str) -> bytes:
    """A claim's bytes: the attempt token and a newline. The newline says the write is
    complete: a reader that finds none (or an empty file) caught its writer between the
    create and the write, or the writer died there."""
    return attempt.encode("ascii") + b"\n"


def parse_claim(data: bytes, epoch: int, where: str | None = None) -> str | None:
    """The attempt an ``epochs/<epoch>`` claim names; None while it is incomplete (empty,
    or no final newline); BadName for anything else: a claim holds exactly one token of
    that very epoch (the C plugin reads claims by the same rule, tests/vectors/claims.json)."""
    if not data.endswith(b"\n"):
        return None
    m = _CLAIM_RE.fullmatch(data)
    if m is None or m[1] != str(epoch).encode():
        raise BadName(claim_name(epoch), f"not a claim of epoch {epoch} (<cluster>.<job>.{epoch} and a newline): "
                      f"{data[:80]!r}", where)
    return data[:-1].decode("ascii")


def attempt_token(cluster: str, job_id: str, epoch: int) -> str:
    """DISPATCH_ATTEMPT: '<cluster>.<job id>.<epoch>'.

    Derived, not allocated: every node computes the same token from facts Slurm
    gives it, with no coordination. Cluster characters outside [A-Za-z0-9_-] become
    '_' so '.' separates fields one way only; the job id is digits (an array task
    has its own job id); the epoch differs between executions of one job id."""
    if not cluster or len(cluster) > 64:
        raise EnvError(f"cluster name {cluster!r} must be 1..64 characters")
    if _DEC.fullmatch(job_id or "") is None:
        raise EnvError(f"Slurm job id {job_id!r} must be decimal digits")
    decompose(epoch)
    return f"{cluster_token(cluster)}.{job_id}.{epoch}"


def attempt_parts(attempt: str) -> tuple[str, int, int] | None:
    """(cluster as the token spells it, job id, epoch) of an attempt token, or None for
    a name that is not one: what gc needs to ask Slurm about an execution."""
    epoch = attempt_epoch(attempt)
    cluster, _, job = attempt.rpartition(".")[0].rpartition(".")
    if epoch is None or not cluster or _DEC.fullmatch(job) is None:
        return None
    return cluster, int(job), epoch


def cluster_token(cluster: str) -> str:
    """The cluster's name as attempt tokens spell it."""
    return _TOKEN_SAFE.sub("_", cluster)


@lru_cache(maxsize=256)
def attempt_epoch(attempt: str) -> int | None:
    """The epoch an attempt token carries (its last field), or None for a name that is
    not a token. The store uses it to refuse a save published at another epoch than
    the execution that wrote it (on every publication: the answer is kept)."""
    head, _, tail = attempt.rpartition(".")
    if not head or _DEC.fullmatch(tail) is None or len(tail) > 20:
        return None
    try:
        decompose(int(tail))
    except DispatchError:
        return None
    return int(tail)


def step_regex(pattern: str) -> re.Pattern:
    """A ``--pattern`` (watch, gc) compiled: a regular expression with exactly one group,
    the step. Checked here once, so both commands refuse a bad one in the same words."""
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise DispatchError(f"--pattern {pattern!r} is not a regular expression: {e}") from None
    if regex.groups != 1:
        raise DispatchError(f"--pattern {pattern!r} must have exactly one group (the step)")
    return regex


#: the names frameworks give their save of step N, besides ``checkpoint-N``: Megatron's
#: ``iter_<N, 7 digits>``, torchtitan's ``step-N`` (a padded name is still step N)
FRAMEWORK_STEPS = (r"iter_([0-9]+)", r"step-([0-9]+)")


def named_step(path, pattern: str = STEP_PATTERN) -> int | None:
    """The step a save's name says (``pattern``'s, else a framework's own name), or None
    for a name that says none: a save is published at that step and no other (unless
    adopted), so a publication that disagrees with it was not made by ``publish``."""
    leaf = os.path.basename(os.path.normpath(os.fspath(path)))
    for regex in (pattern, *FRAMEWORK_STEPS):
        m = re.fullmatch(regex, leaf)
        if m is not None and m[1].isdigit():
            return int(m[1])
    return None


def step_of(path, pattern: str = STEP_PATTERN) -> int:
    """The step in a save's name (``checkpoint-<step>`` by default)."""
    m = re.fullmatch(pattern, os.path.basename(os.path.normpath(os.fspath(path))))
    if m is None or not m[1].isdigit():
        raise BadPath(f"cannot tell the step of {os.fsdecode(path)!r}: its name does not match {pattern!r}; "
                      "pass the step explicitly (--step)")
    if int(m[1]) > STEP_MAX:
        raise BadPath(f"{os.fsdecode(path)!r}: step {int(m[1])} is out of range 0..{STEP_MAX}; "
                      "a step is a signed 64-bit integer")
    return int(m[1])


def expand_root(root: str, task_id: str | None) -> str:
    """An array task is its own dispatch job, so its root must differ from its
    siblings': the root's last component carries '%a' (as in sbatch's file name
    patterns), replaced by the task id. The node Prolog never sees the task id
    (Slurm gives it only to PrologSlurmctld), so the pattern also tells it to leave
    array tasks to the per-task hooks."""
    if "%a" not in root:
        return root
    head, _, leaf = root.rpartition("/")
    if "%a" in head:
        raise EnvError(f"checkpoint root {root!r}: %a may only appear in the last component")
    if not task_id:
        raise EnvError(f"checkpoint root {root!r} has %a but this job is not an array task")
    if _DEC.fullmatch(task_id) is None:
        raise EnvError(f"SLURM_ARRAY_TASK_ID {task_id!r} must be decimal digits")
    return f"{head}/{leaf.replace('%a', str(int(task_id)))}"


def submission_dir(root: str) -> str:
    """Where N is allocated: the root, or for an array pattern the folder holding the
    task roots (one submission covers every task of the array)."""
    return root.rpartition("/")[0] or "/" if "%a" in root else root


def split_s3(root: str) -> tuple[str, str]:
    """(bucket, key prefix) of an S3 root ``s3://bucket[/prefix]``; the prefix is ''
    or ends in '/'. On S3 'a//b' and 'a/b' are different keys, so an empty, '.' or '..'
    component is refused rather than normalized away (only a trailing '/' is dropped)."""
    if not root.startswith(S3_SCHEME):
        raise EnvError(f"checkpoint root {root!r} is not an S3 root (s3://bucket/prefix)")
    bucket, _, prefix = root[len(S3_SCHEME):].partition("/")
    if _BUCKET.fullmatch(bucket) is None:
        raise EnvError(f"checkpoint root {root!r}: {bucket!r} is not an S3 bucket name "
                       "(3-63 characters: a-z 0-9 . -)")
    prefix = prefix.rstrip("/")
    if "\0" in prefix or "%a" in prefix.rpartition("/")[0]:
        raise EnvError(f"checkpoint root {root!r}: a NUL byte, or %a outside the last component")
    if prefix and any(p in ("", ".", "..") for p in prefix.split("/")):
        raise EnvError(f"checkpoint root {root!r}: an empty, '.' or '..' component names another prefix "
                       "on S3; write the prefix exactly")
    return bucket, f"{prefix}/" if prefix else ""


def normalize_root(root: str) -> str:
    """An absolute root with '//', '/./' and a trailing '/' removed; '..' refused.

    Lexical only: the root's symlinks are the user's business and are kept, so the
    value is the same on every node whatever the node resolves them to. An S3 root
    (``s3://bucket/prefix``) is checked by ``split_s3`` and kept as written, less a
    trailing '/'."""
    if root and root.startswith(S3_SCHEME):
        bucket, prefix = split_s3(root)
        return f"{S3_SCHEME}{bucket}" + (f"/{prefix[:-1]}" if prefix else "")
    if not root or not root.startswith("/"):
        raise EnvError(f"checkpoint root {root!r} must be an absolute path or s3://bucket/prefix")
    if "\0" in root:
        raise EnvError("checkpoint root contains a NUL byte")
    parts = [p for p in root.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise EnvError(f"checkpoint root {root!r} must not contain '..'")
    if any("%a" in p for p in parts[:-1]):
        raise EnvError(f"checkpoint root {root!r}: %a may only appear in the last component")
    return "/" + "/".join(parts)

PATH_MAX = 4095  # bytes of a path the plugin holds (DSP_PATH less its NUL)


def view_relpath(root: str, view: str, label: str = "view folder") -> str:
    """The view folder ``view`` of the job whose normalized POSIX root is ``root``, as the
    path below the root: absolute, normalized like the root, neither the root itself nor
    outside it nor in one of the root's own folders. The plugin's dsp_view_rel, word for word
    (tests/vectors/view.json); ``label`` names it in messages."""
    if "\0" in view:
        raise EnvError(f"{label} contains a NUL byte")
    if not view.startswith("/"):
        raise EnvError(f"{label} '{view}' must be an absolute path")
    parts = [p for p in view.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise EnvError(f"{label} '{view}' must not contain '..'")
    norm = "/" + "/".join(parts)
    if len(norm.encode("utf-8", "surrogateescape")) > PATH_MAX:
        raise EnvError(f"{label} '{view}' is too long")
    inside = f"name a folder inside it (e.g. {root}/out)"
    if norm == root:
        raise EnvError(f"{label} '{view}' is the checkpoint root itself: {inside}")
    prefix = "/" if root == "/" else f"{root}/"
    if not norm.startswith(prefix):
        raise EnvError(f"{label} '{view}' is not inside the checkpoint root {root}: {inside}")
    rel = norm[len(prefix):]
    if rel.split("/")[0] in layout.VIEW_REFUSED:
        raise EnvError(f"{label} '{view}' is in {root}/{rel.split('/')[0]}, dispatch-slurm's own folder: "
                       f"name another folder inside the root (e.g. {root}/out)")
    return rel


# --- bulk validation: the same rules as parse(), for a whole listing at once ---
# Readers must parse every entry of pub/ (a skipped entry could be the latest), and
# parse() costs ~4 us per name in Python. all_valid() applies the same rules with a
# constant number of C-level passes per chunk of names (slices, translate, one
# int(x, 32) decode, substring tests), ~0.5 us per name; chunks keep those passes in
# the CPU cache. It only answers yes/no: on "no" the caller runs parse() entry by
# entry to name the bad one. tests/test_names.py checks that both agree.
#
# The paths are decoded together: each is followed by a separator that completes its
# last 40-bit quantum and decodes to b"\0x..x\0" (the first NUL takes the path's tail
# bits). So a decoded path sits between NULs, and mapping NUL and '/' to '/' turns
# every non-canonical path (absolute, trailing '/', empty, '', '.' or '..' component)
# into one of three substrings. Lengths base32 cannot have get '!', which is not base32.
_B32B = _B32.encode()
_TO_INT32B = bytes.maketrans(_B32B, b"0123456789abcdefghijklmnopqrstuv")
_DIGITS0 = bytes.maketrans(b"0123456789", b"0000000000")
_NONZERO = bytes.maketrans(b"0123456789", b"\0\1\1\1\1\1\1\1\1\1")
_HEAD = b"0" * 20 + b"-" + b"0" * 20 + b"-"
_STEP_MAX_DIGITS = f"{STEP_MAX:020d}".encode()
_CHUNK = 4096


def _separator(r: int) -> str:
    """Base32 that completes a path of length r (mod 8) and decodes to b"\0x..x\0"."""
    whole = r * 5 // 8  # bytes the path fills in its last 5-byte quantum
    extra = 5 - whole if whole < 3 else 10 - whole  # room for NUL, filler, NUL
    return b32encode(bytes(whole + 1) + b"x" * (extra - 2) + b"\0")[r:]


_SEPARATORS = [_separator(r) if r in _PAD_BITS else "!" for r in range(8)]
# (last character, separator) of every canonical path: the tail bits are zero
_TAILS = {(_B32[i], _SEPARATORS[r]) for r, z in _PAD_BITS.items() for i in range(0, 32, 1 << z)}
_CLASSES = bytes(47 if i in (0, 47) else 46 if i == 46 else 120 for i in range(256))
_head, _path, _last = itemgetter(slice(0, 42)), itemgetter(slice(42, None)), itemgetter(slice(-1, None))


def _chunk_valid(entries: list[str]) -> bool:
    n = len(entries)
    try:
        heads = "".join(map(_head, entries)).encode("ascii")
    except UnicodeEncodeError:
        return False
    if heads.translate(_DIGITS0) != _HEAD * n:
        return False
    nonzero = 0  # submission N (digits 8..13 of the epoch) must not be 000000
    for k in range(8, 14):
        nonzero |= int.from_bytes(heads[k::42].translate(_NONZERO), "big")
    if 0 in nonzero.to_bytes(n, "big"):
        return False
    if heads[21::42] != b"0" * n or (b"9" in heads[22::42] and max(
            heads[k + 21:k + 41] for k in range(0, 42 * n, 42)) > _STEP_MAX_DIGITS):
        return False  # a step past STEP_MAX (one of 19 digits that begins with 9: compared in full)
    paths = list(map(_path, entries))
    seps = list(map(_SEPARATORS.__getitem__, map(mod, map(len, paths), repeat(8))))
    if not set(zip(map(_last, paths), seps)) <= _TAILS:
        return False
    try:
        data = "".join(chain.from_iterable(zip(paths, seps))).encode("ascii")
    except UnicodeEncodeError:
        return False
    if data.translate(None, _B32B):
        return False
    raw = b"\0" + int(data.translate(_TO_INT32B), 32).to_bytes(len(data) * 5 // 8, "big")
    if raw.count(0) != 1 + 2 * n:  # a NUL inside a path
        return False
    classes = raw.translate(_CLASSES)
    return not (b"//" in classes or b"/./" in classes or b"/../" in classes)


def all_valid(entries: list[str]) -> bool:
    """True iff parse() would accept every entry (see the comment above)."""
    return all(_chunk_valid(entries[i:i + _CHUNK]) for i in range(0, len(entries), _CHUNK))
