"""Every entry under a checkpoint root, named once.

The protocol's readers and writers (store, supervisor, hooks, gc) take their names
from here, and the on-disk contract table of docs/design.md is checked against ``ENTRIES``
(tests/test_docs.py), so the layout cannot drift from its documentation."""

EXEC = "exec"          # exec/<attempt>/: one execution's saves
PUB = "pub"            # pub/<name>: publications
SUB = "sub"            # sub/<NNNNNN>: submission numbers
EVENTS = "events"      # events/<attempt>.<host>.<pid>.jsonl
CEASED = "ceased"      # ceased/<attempt>.<node>: the Epilog's cessation evidence
RECORD = "record.jsonl"  # the supervisor's facts
CLAIMS = "supervisor"  # supervisor/<NNNNNN>: who writes the record
REQUESTS = "requests"  # requests/release.<k>, requests/supersede.<G>, requests/stop.<G>
RETIRED = "retired"    # retired/<publication name>: gc (empty) or a person (who and why) retired it
PINNED = "pinned"      # pinned/<b32 path>: a save gc never removes
EPOCHS = "epochs"      # epochs/<epoch, 20 digits>: the one execution (attempt) that runs at that epoch
JOBS = "jobs"          # jobs/<cluster>.<job id>: the N a plain sbatch job's first process allocated
PROBES = "dispatch-probe"  # exec/<attempt>/dispatch-probe/<host>.<pid>.jsonl: the handler's probe records
RESUMES = "dispatch-resume"  # exec/<attempt>/dispatch-resume/<publication name>/<leaf>: the save it resumes from
HELD = "held"          # held/<publication name>/<leaf>: the publication's own links to its save's files
VIEW = "dispatch-view"  # exec/<attempt>/dispatch-view: what the view's prepare placed in the folder

#: (entry, who writes it, what it is): the on-disk contract, in the order docs/design.md shows.
ENTRIES = (
    ("exec/<attempt>/...", "the execution", "one execution's saves; nothing else writes there"),
    ("exec/<attempt>/dispatch-resume/<epoch>-<step>-<b32>/<leaf>", "`latest --resume`, `resume_point` (every "
     "integration's resume)", "the published save the execution resumes from, under its last name: clones "
     "(reflinks) where the filesystem makes them, else hard links to its read-only files; a write there never "
     "reaches the published save; gc removes it once the execution has ceased"),
    ("exec/<attempt>/dispatch-view", "`view prepare` (the plugin's view, before the execution's first task)",
     "what the view placed in the folder its trainer sees as its own: the latest publication under the path the "
     "trainer looks for (as the resume copy is made) and the framework's pointer file (DeepSpeed's `latest`, "
     "Megatron's tracker), written fresh; one JSON line, whole when it appears. Its presence makes every later "
     "prepare of the execution a no-op; its publisher never publishes what it names, gc and the report count it "
     "as a copy"),
    ("pub/<epoch>-<step>-<b32>", "publish", "publications: empty, never renamed, rewritten or appended to"),
    ("held/<epoch>-<step>-<b32>/<leaf>", "publish", "the publication's own hard links to its save's files, made "
     "read-only when it publishes: a trainer's rotation or an `rm` of the save cannot take what the latest "
     "publication names; kept for its execution's newest publication (an older one's goes when it publishes a "
     "newer save), and by gc until it removes the save"),
    ("sub/<NNNNNN>", "submit, the plugin, the supervisor", "submission numbers, O_EXCL-allocated"),
    ("epochs/<epoch, 20 digits>", "the first process of an execution (env, the hooks, the plugin), or its "
                                  "first publish", "the epoch's claim: `<attempt>` and a newline, O_EXCL, "
                                                   "fsynced; another job at that epoch is refused"),
    ("jobs/<cluster>.<job id>", "the first process of a job submitted without `submit` or the plugin (env, "
                                "the TaskProlog)", "the job's submission number: six digits and a newline, "
                                                   "O_EXCL, fsynced; its requeues find the same N there"),
    ("events/<attempt>.<host>.<pid>.jsonl", "every process", "events (JSON lines), one file per process"),
    ("ceased/<attempt>.<node>", "the Epilog, as the job user", "cessation evidence: the execution's processes "
                                                               "on that node are gone"),
    ("record.jsonl", "the supervisor", "the supervisor's facts, one JSON object per line, fsynced"),
    ("supervisor/<NNNNNN>[.exited]", "the supervisor", "claims: who writes the record; .exited when one stops"),
    ("requests/<verb>.<k>", "a person (release, supersede, stop)", "requests the supervisor picks up"),
    ("retired/<epoch>-<step>-<b32>", "gc, retire (a person)",
     "a retired publication, never resumed from; O_EXCL, fsynced before gc touches its save. gc's are empty "
     "(the save is gone or being removed; never the latest); a person's hold who and why (one JSON line), "
     "and `latest` skips it to the previous publication"),
    ("pinned/<b32>", "gc --pin, publish --adopt (while it adopts)", "a save (or a folder of saves) "
                                                                     "gc never removes"),
)

#: entries a save may never be: publishing or adopting one of them is refused
PROTOCOL = frozenset({PUB, SUB, EPOCHS, JOBS, EVENTS, CEASED, RECORD, CLAIMS, REQUESTS, RETIRED, PINNED, HELD})
#: where the SPANK plugin's view (the folder a trainer writes, bound to exec/<attempt>/) may not
#: be below a root: its own folders and exec/ itself (spank_env/layout.c holds the same names)
VIEW_REFUSED = PROTOCOL | {EXEC}


def exec_relpath(attempt: str) -> str:
    return f"{EXEC}/{attempt}"


def table() -> str:
    """The on-disk contract as docs/design.md shows it (a Markdown table)."""
    rows = ["| entry | written by | what |", "|---|---|---|"]
    rows += [f"| `<root>/{e}` | {who} | {what} |" for e, who, what in ENTRIES]
    return "\n".join(rows)
