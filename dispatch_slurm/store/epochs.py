"""One epoch per execution: ``<root>/epochs/<epoch, 20 digits>`` names the one attempt that
runs and publishes at that epoch.

The epoch orders lineages (an old run's late save never outranks its replacement's) only
if two jobs never share one. A submission number allocated under ``sub/`` gives every
submission its own epoch, but nothing stops a user from setting ``DISPATCH_SUBMISSION``
by hand in two jobs. So every process that computes an execution's environment (``env``,
the Prolog's user child, the TaskProlog; the plugin's user_init in C, spank_env/claim.c)
first refuses an N that ``sub/`` never allocated, then claims the epoch: the first one
creates the claim, O_EXCL, holding its attempt token and a newline, fsynced; every later
process of that execution (another node, task or step) computes the same token and finds
its own claim; a process of another job finds a foreign one and is refused, naming that
job, before it writes anything (its exec folder, empty, at most). ``publish`` reads the
claim too (one open and read), so a publication at an epoch another attempt claimed is
refused, and a root from before claims existed gets its claims at its first publishes.
No lock: the create decides, as for ``sub/`` and ``pub/``.

A claim read empty or without its newline is being written (its writer is between the
create and the write) or its writer died there: it is read again until ``SETTLE_S``, then
refused naming the file. On S3 the claim is one conditional PUT (If-None-Match: *) with
its body, so it is never seen half-written; a 412 is answered by a GET."""

import time
from collections.abc import Mapping

from ..contract import env as envmod
from ..contract import layout, names
from ..contract.epoch import R_MAX, decompose
from ..contract.siteconf import Site
from ..errors import BadName, BadPath, DispatchError, EnvError, StoreError
from . import jobs
from .base import Store
from .roots import at

SETTLE_S = 5.0  # how long an incomplete claim is read again before it is refused
#: (root, epoch, attempt) -> the identity of the claim file this process read naming the
#: attempt that publishes. A claim is written once, so while that very file is there (not
#: removed and made again by another job: a root wiped while its old job runs) each of a
#: trainer's publications looks at it instead of reading it again.
_own_claims: dict[tuple[str, int, str], tuple[int, ...]] = {}
_sleep = time.sleep  # between reads of an incomplete claim (a test makes the wait observable)


class EpochClaimed(DispatchError):
    """Another execution (attempt) owns the epoch."""

    def __init__(self, message: str, owner: str):
        super().__init__(message)
        self.owner = owner


def epoch_of(attempt: str) -> int:
    epoch = names.attempt_epoch(attempt)
    if epoch is None:
        raise BadPath(f"attempt token {attempt!r} is not <cluster>.<job>.<epoch>")
    return epoch


def _job(attempt: str) -> str:
    """``<cluster>.<job id>`` of an attempt token: the job, as its user knows it."""
    return attempt.rpartition(".")[0]


def _fix(root: str) -> str:  # the C plugin says the same (spank_env/claim.c, FIX): change both or neither
    return (f"fix: submit with `dispatch-slurm submit {root} -- ...` or `sbatch --dispatch-checkpoint={root}` "
            "(each allocates a new submission number); never set DISPATCH_SUBMISSION by hand")


def claimed_message(root: str, epoch: int, owner: str, attempt: str, fix_root: str | None = None) -> str:
    """Why ``attempt`` may not run at ``epoch``: ``owner`` claimed it first."""
    return (f"epoch {epoch} of {root} is already claimed by job {_job(owner)} "
            f"({root}/{layout.EPOCHS}/{names.claim_name(epoch)}); this job ({_job(attempt)}) would share its "
            "epoch: it would resume from that job's saves and publish among them, and the other job's lineage "
            f"could be taken for the latest; {_fix(fix_root or root)}")


# ---- the rule, over any store's create and read ---------------------------------------------

def _settled(st: Store, epoch: int, missing_root_ok: bool = False) -> str | None:
    """The attempt the claim names, None if there is none; an incomplete one is read
    again until SETTLE_S, then refused naming the file. ``missing_root_ok``: a root that
    does not exist yet (an array task's, made with its exec folder) has no claims. The
    claim is never read through a symlink (the store's read)."""
    name, where = names.claim_name(epoch), st.where(layout.EPOCHS)
    deadline, pause = time.monotonic() + SETTLE_S, 0.01
    while True:
        data = None if missing_root_ok and st.root_missing() else st.read(layout.EPOCHS, name, names.CLAIM_MAX + 1)
        if data is None:
            return None
        if len(data) > names.CLAIM_MAX:
            raise BadName(name, f"{len(data)}+ bytes: not a claim", where)
        owner = names.parse_claim(data, epoch, where)
        if owner is not None:
            return owner
        if time.monotonic() >= deadline:
            raise StoreError(
                f"{where}/{name} is still {'empty' if not data else 'without its newline'} "
                f"after {SETTLE_S:g} s: the process that created it died before writing it (or the filesystem "
                f"is stalled), so no job can run at epoch {epoch}: if none of this root's jobs runs at it, "
                f"remove that file, and resubmit (`dispatch-slurm submit {st.root} -- ...`)")
        _sleep(pause)
        pause = min(pause * 2, 0.2)


def claimant(st: Store, epoch: int) -> str | None:
    """The attempt that claimed ``epoch``, None when nobody has."""
    return _settled(st, epoch)


def _take(st: Store, epoch: int, mine: str) -> str:
    """Who claimed ``epoch``, a missing claim created for ``mine`` first (the create decides
    between racers)."""
    name = names.claim_name(epoch)
    for _ in range(3):  # a claim removed by hand between a failed create and the read: again
        owner = _settled(st, epoch)
        if owner is not None:
            return owner
        try:
            if st.create(layout.EPOCHS, name, names.claim_content(mine)):  # the content made durable, then epochs/
                return mine
        except OSError as e:
            raise StoreError(f"{st.where(layout.EPOCHS, name)}: {e.strerror}") from None
    raise StoreError(f"{st.where(layout.EPOCHS, name)} keeps vanishing: something removes "
                     "claims (dispatch-slurm never does)")


# ---- the entry points ---------------------------------------------------------------------

def claim(st: Store, attempt: str, fix_root: str | None = None) -> None:
    """Claim the epoch ``attempt`` carries for it in ``st``'s root, or find it already its
    own; EpochClaimed (naming the other job and the fix) when another attempt holds it.
    ``fix_root``: the root to name in the fix (an array job's %a pattern)."""
    epoch = epoch_of(attempt)
    owner = _take(st, epoch, attempt)
    if owner != attempt:
        raise EpochClaimed(claimed_message(st.root, epoch, owner, attempt, fix_root), owner)


def check_submission(st: Store, n: int, label: str = "DISPATCH_SUBMISSION") -> None:
    """Refuse a submission number never allocated under ``<root>/sub/`` (``st``: the store
    of the root where N is allocated, the parent of an array's %a roots): a hand-set N is
    how two jobs come to share an epoch."""
    decompose(n * 10**6)  # N in range
    entry, root = names.submission_name(n), st.root
    if not st.has(layout.SUB, entry):
        raise EnvError(f"{label}={n} was never allocated under {root} (no {root}/{layout.SUB}/{entry}): a submission "
                       f"number comes from `dispatch-slurm submit {root} -- ...`, `dispatch-slurm run` or `sbatch "
                       f"--dispatch-checkpoint={root}`, which create {layout.SUB}/<N> and pass N to the job, or "
                       "leave it unset in a plain sbatch job, which then allocates its own; never set it by hand")


def prepare(st: Store, values: Mapping[str, str], mode: int, pattern: str, label: str = "DISPATCH_SUBMISSION",
            mkdir: bool = True) -> str:
    """What every way in does once it has the execution's values (enter(); remote.c and
    claim.c in the plugin): refuse an epoch another job claimed; for the execution's first
    process, refuse an N never allocated; make the exec folder; claim the epoch. ``st``:
    the store of the root where the job's N is allocated (job_store()); ``pattern``: the
    root as the job named it (an array's ``.../task-%a``, whose task root is the one other
    store opened here); ``mkdir=False`` checks only, creating nothing. The exec folder
    exists before the claim: an array task's root is made with it."""
    root, attempt = values["DISPATCH_CHECKPOINT"], values["DISPATCH_ATTEMPT"]
    epoch, array = epoch_of(attempt), "%a" in pattern
    here = st if st.root == root else at(root)
    st.reachable()  # a missing bucket is said as such, not as a missing claim
    owner = _settled(here, epoch, missing_root_ok=array)
    if owner is not None and owner != attempt:
        raise EpochClaimed(claimed_message(root, epoch, owner, attempt, pattern), owner)
    if owner is None:  # the first process: its N must be one a submission allocated (a later
        # one finds the claim, as does a step re-running env with an array task's expanded root)
        check_submission(st, int(values["DISPATCH_SUBMISSION"]), label)
    if not mkdir:
        return values["DISPATCH_EXEC_DIR"]
    path = here.make_exec_dir(attempt, mode, create_root=array)
    if owner is None:
        try:
            claim(here, attempt, pattern)
        except (OSError, StoreError):  # a full filesystem: no execution entered, no folder left of one
            if _settled(here, epoch) is None:
                here.drop_empty([attempt])
            raise
    return path


def job_store(inputs: Mapping[str, str]) -> Store:
    """The one store enter() takes: the root the job named, where its N is allocated (for an
    array's ``.../task-%a``, the folder holding the task roots)."""
    return at(names.submission_dir(envmod.named_root(inputs)))


def enter(st: Store, inputs: Mapping[str, str], site: Site, *, create: bool = True, own_number: bool = True,
          label: str = "DISPATCH_SUBMISSION") -> dict[str, str]:
    """Every way into an execution written in Python (``env`` and ``env --local``, the
    Prolog's user child, the TaskProlog) comes here, so they cannot drift: the job's N (a
    plain sbatch job's own, jobs.fill), the values (contract/env.compute: the contract the C
    plugin's user_init computes too, tests/vectors), then prepare(). ``st``: job_store(inputs),
    opened once by the caller and used for every step; ``create=False`` (env --no-mkdir)
    looks up and checks, creating nothing; ``own_number=False`` (the Prolog: its jobs carry
    the N sbatch's plugin allocated) never allocates one. The execution's values, in
    contract order."""
    filled = jobs.fill(st, inputs, site, create=create) if own_number else inputs
    values = envmod.compute(filled, site)
    prepare(st, values, site.exec_mode, envmod.named_root(inputs), label, mkdir=create)
    return values


def for_publication(st: Store, epoch: int, publisher: str | None, save) -> str:
    """The attempt a publication at ``epoch`` is made for; refuses one at an epoch another
    attempt claimed. ``publisher``: the publishing execution (DISPATCH_ATTEMPT, else the
    writer of its own save), which claims an unclaimed epoch (roots from before claims, a
    publish outside the hooks); None (an adoption outside any execution) joins the epoch's
    claimant, and is refused at an unclaimed epoch, which it cannot claim for anyone."""
    if publisher is not None and names.attempt_epoch(publisher) != epoch:
        raise BadPath(f"refusing to publish {save} at epoch {epoch}: DISPATCH_ATTEMPT={publisher} is an "
                      f"execution of epoch {names.attempt_epoch(publisher)}; publish at its own epoch")
    root, name, before = st.root, names.claim_name(epoch), None
    if publisher is not None:
        before = st.identity(layout.EPOCHS, name)
        if before is not None and _own_claims.get((root, epoch, publisher)) == before:
            return publisher
    owner = _take(st, epoch, publisher) if publisher is not None else _settled(st, epoch)
    where = st.where(layout.EPOCHS, name)
    if owner is None:
        raise BadPath(f"refusing to adopt {save} at epoch {epoch}: no execution has claimed that epoch "
                      f"({where} does not exist) and DISPATCH_ATTEMPT is not set; adopt from inside the "
                      "job that runs at it (after `eval \"$(dispatch-slurm env)\"`)")
    if publisher is not None and owner != publisher:
        raise EpochClaimed(f"refusing to publish {save} at epoch {epoch}: that epoch of {root} is claimed by job "
                           f"{_job(owner)} ({where}), not by this execution ({publisher}): two jobs at one epoch "
                           f"would mix their lineages; {_fix(root)}", owner)
    if publisher is not None and before is not None and st.identity(layout.EPOCHS, name) == before:
        _own_claims[(root, epoch, publisher)] = before  # read from this very file
    return owner


def newest_of_job(root: str, attempt: str) -> str:
    """The newest execution of ``attempt``'s job (same ``<cluster>.<job id>``) that has
    claimed an epoch in ``root``: ``attempt`` itself if none outranks it. A job's
    requeues keep its job id and raise R, so a greater claimed epoch of the same job id
    is a later execution of that very job (the submitit integration's answer check)."""
    mine = epoch_of(attempt)
    top = mine - decompose(mine).restart + R_MAX  # a requeue changes R only: the job's epochs end here
    st = at(root)
    for name in sorted(st.listing(layout.EPOCHS), reverse=True):
        if not name.isdigit() or not mine < int(name) <= top:
            continue
        owner = _settled(st, int(name))
        if owner is not None and _job(owner) == _job(attempt):
            return owner  # the greatest such epoch: the listing is walked from the top
    return attempt
