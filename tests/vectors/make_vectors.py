"""Regenerate tests/vectors/*.json (then review the diff).

Deliberately independent of dispatch_slurm: base32 from the stdlib's base64, epochs
by plain arithmetic, tokens and env by the contract's wording. Python, the C plugin
and the cluster tests all check themselves against these files."""

import base64
import json
import pathlib

HERE = pathlib.Path(__file__).parent


def b32(path: str) -> str:
    return base64.b32encode(path.encode()).decode().rstrip("=")


def epoch(g, n, r):
    return g * 10**12 + n * 10**6 + r


def dump(name, data):
    (HERE / name).write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")


EPOCHS = {
    "valid": [{"g": g, "n": n, "r": r, "epoch": epoch(g, n, r)} for g, n, r in [
        (0, 1, 0), (0, 1, 1), (0, 2, 0), (1, 1, 0), (0, 999_999, 999_999), (99_999_999, 999_999, 999_999),
        (3, 42, 7), (0, 500_000, 123_456)]],
    "invalid": [
        {"g": -1, "n": 1, "r": 0, "part": "generation"}, {"g": 100_000_000, "n": 1, "r": 0, "part": "generation"},
        {"g": 0, "n": 0, "r": 0, "part": "submission"}, {"g": 0, "n": 1_000_000, "r": 0, "part": "submission"},
        {"g": 0, "n": -5, "r": 0, "part": "submission"}, {"g": 0, "n": 1, "r": -1, "part": "restart"},
        {"g": 0, "n": 1, "r": 1_000_000, "part": "restart"}],
    "invalid_epochs": [0, 999_999, 5 * 10**12 + 999_999, 10**20, -1],
}

PATHS = ["exec/linux.42.1000000/checkpoint-500", "a", "ab", "abc", "abcd", "abcde", "x/y/z",
         "exec/c.1.1000000/ckpt-0001", "exec/é/ünïcode", ".hidden/x", "a..b/c", "exec/a b/c d"]
NAMES = {
    "valid": [{"epoch": e, "step": s, "path": p, "name": f"{e:020d}-{s:020d}-{b32(p)}"}
              for (e, s), p in zip([(1_000_000, 500), (1_000_000, 0), (2_000_001, 7), (10**12 + 10**6, 9 * 10**18),
                                    (1_000_000, 2**63 - 1), (99_999_999_999_999_999_999, 1)] * 2, PATHS)],
    "invalid_names": [
        "", "latest", "00000000000001000000-00000000000000000500",
        "0000000000001000000-00000000000000000500-ME",            # 19-digit epoch
        "00000000000001000000-0000000000000000500-ME",            # 19-digit step
        "00000000000001000000-00000000000000000500-me",           # lower case
        "00000000000001000000-00000000000000000500-ME======",     # padding
        "00000000000001000000-00000000000000000500-M",            # impossible length
        "00000000000001000000-00000000000000000500-MF",           # non-zero tail bits
        "00000000000001000000-00000000000000000500-ME0",          # '0' not base32
        "00000000000001000000-00000000000000000500-M-E",
        "00000000000000000000-00000000000000000500-ME",           # N = 0
        "00000000000001000000-09223372036854775808-ME",           # step 2**63: past a signed 64-bit step
        "00000000000001000000-18446744073709551616-ME",           # step 2**64
        "00000000000001000000-99999999999999999999-ME",
        "+0000000000001000000-00000000000000000500-ME",
        "00000000000001000000-00000000000000000500-ME\n",
        ".00000000000001000000-00000000000000000500-ME",
        f"00000000000001000000-00000000000000000500-{b32('/etc/passwd')}",
        f"00000000000001000000-00000000000000000500-{b32('../x')}",
        f"00000000000001000000-00000000000000000500-{b32('a/../../x')}",
        f"00000000000001000000-00000000000000000500-{b32('a//b')}",
        f"00000000000001000000-00000000000000000500-{b32('a/./b')}",
        f"00000000000001000000-00000000000000000500-{b32('a/')}",
        f"00000000000001000000-00000000000000000500-{b32('.')}",
        f"00000000000001000000-00000000000000000500-{b32('..')}",
        f"00000000000001000000-00000000000000000500-{b32('a' + chr(0) + 'b')}",
    ],
    "invalid_paths": ["", "/abs", "..", "../x", "a/..", "a/../b", "a//b", "./a", "a/.", "a/", "a\u0000b"],
}

TOKENS = {
    "valid": [
        {"cluster": "linux", "job_id": "42", "epoch": 1_000_000, "token": "linux.42.1000000"},
        {"cluster": "linux", "job_id": "42", "epoch": 1_000_001, "token": "linux.42.1000001"},
        {"cluster": "my.cluster", "job_id": "7", "epoch": 10**12 + 2 * 10**6, "token": "my_cluster.7.1000002000000"},
        {"cluster": "c-1_x", "job_id": "123456789", "epoch": 3_000_000, "token": "c-1_x.123456789.3000000"},
        {"cluster": "a b/c", "job_id": "1", "epoch": 1_000_000, "token": "a_b_c.1.1000000"},
    ],
    "invalid": [
        {"cluster": "", "job_id": "42", "epoch": 1_000_000},
        {"cluster": "x" * 65, "job_id": "42", "epoch": 1_000_000},
        {"cluster": "linux", "job_id": "42_3", "epoch": 1_000_000},
        {"cluster": "linux", "job_id": "", "epoch": 1_000_000},
        {"cluster": "linux", "job_id": "42", "epoch": 0},
    ],
}

BASE = {"SLURM_JOB_ID": "42", "SLURM_CLUSTER_NAME": "linux", "DISPATCH_CHECKPOINT": "/ckpt/run1",
        "DISPATCH_SUBMISSION": "1"}


def expect(root, g, n, r, job="42", cluster="linux", grace=60, shared=False):
    e = epoch(g, n, r)
    att = f"{cluster}.{job}.{e}"
    out = {"DISPATCH_CHECKPOINT": root, "DISPATCH_GENERATION": str(g), "DISPATCH_SUBMISSION": str(n),
           "DISPATCH_RESTART": str(r), "DISPATCH_EPOCH": str(e), "DISPATCH_ATTEMPT": att,
           "DISPATCH_EXEC_DIR": f"{root}/exec/{att}", "DISPATCH_GRACE_S": str(grace)}
    if shared:
        out["DISPATCH_SHARED_CHECKPOINT"] = "1"
    return out


ENV = [
    {"name": "first execution", "env": BASE, "expect": expect("/ckpt/run1", 0, 1, 0)},
    {"name": "requeued twice (task env)", "env": {**BASE, "SLURM_RESTART_COUNT": "2"},
     "expect": expect("/ckpt/run1", 0, 1, 2)},
    {"name": "requeued once (prolog env)", "env": {**BASE, "SLURM_JOB_RESTART_COUNT": "1"},
     "expect": expect("/ckpt/run1", 0, 1, 1)},
    {"name": "prolog var wins", "env": {**BASE, "SLURM_JOB_RESTART_COUNT": "3", "SLURM_RESTART_COUNT": "3"},
     "expect": expect("/ckpt/run1", 0, 1, 3)},
    {"name": "resubmission, superseded", "env": {**BASE, "DISPATCH_SUBMISSION": "7", "DISPATCH_GENERATION": "2"},
     "expect": expect("/ckpt/run1", 2, 7, 0)},
    {"name": "root normalised", "env": {**BASE, "DISPATCH_CHECKPOINT": "//ckpt/./run1//"},
     "expect": expect("/ckpt/run1", 0, 1, 0)},
    {"name": "array task", "env": {**BASE, "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_ID": "45",
                                   "DISPATCH_CHECKPOINT": "/ckpt/sweep/task-%a"},
     "expect": expect("/ckpt/sweep/task-3", 0, 1, 0, job="45")},
    {"name": "array task, recomputed in a step", "env": {**BASE, "SLURM_ARRAY_TASK_ID": "3",
                                                         "DISPATCH_CHECKPOINT": "/ckpt/sweep/task-3",
                                                         "DISPATCH_ATTEMPT": "linux.42.1000000"},
     "expect": expect("/ckpt/sweep/task-3", 0, 1, 0)},
    {"name": "per-job grace", "env": {**BASE, "DISPATCH_GRACE": "120"}, "expect": expect("/ckpt/run1", 0, 1, 0, grace=120)},
    {"name": "account grace", "env": {**BASE, "SLURM_JOB_ACCOUNT": "proj"}, "site": {"grace": 30, "account_grace": {"proj": 200}},
     "expect": expect("/ckpt/run1", 0, 1, 0, grace=200)},
    {"name": "site grace capped", "env": BASE, "site": {"grace": 900, "account_grace": {}},
     "expect": expect("/ckpt/run1", 0, 1, 0, grace=300)},
    {"name": "shared checkpoint", "env": {**BASE, "DISPATCH_SHARED_CHECKPOINT": "1"},
     "expect": expect("/ckpt/run1", 0, 1, 0, shared=True)},
    {"name": "odd cluster name", "env": {**BASE, "SLURM_CLUSTER_NAME": "hpc.site"},
     "expect": expect("/ckpt/run1", 0, 1, 0, cluster="hpc_site")},
    {"name": "leading zeros accepted", "env": {**BASE, "DISPATCH_SUBMISSION": "007"},
     "expect": expect("/ckpt/run1", 0, 7, 0)},
]
ENV_ERRORS = [
    {"env": {**BASE, "DISPATCH_CHECKPOINT": ""}, "error": "DISPATCH_CHECKPOINT"},
    {"env": {**BASE, "DISPATCH_CHECKPOINT": "ckpt/run1"}, "error": "absolute"},
    {"env": {**BASE, "DISPATCH_CHECKPOINT": "/ckpt/../etc"}, "error": ".."},
    {"env": {**BASE, "DISPATCH_SUBMISSION": ""}, "error": "DISPATCH_SUBMISSION"},
    {"env": {**BASE, "DISPATCH_SUBMISSION": "0"}, "error": "DISPATCH_SUBMISSION"},
    {"env": {**BASE, "DISPATCH_SUBMISSION": "1000000"}, "error": "DISPATCH_SUBMISSION"},
    {"env": {**BASE, "DISPATCH_SUBMISSION": "x1"}, "error": "DISPATCH_SUBMISSION"},
    {"env": {**BASE, "DISPATCH_GENERATION": "-1"}, "error": "DISPATCH_GENERATION"},
    {"env": {**BASE, "DISPATCH_GENERATION": "100000000"}, "error": "DISPATCH_GENERATION"},
    {"env": {**BASE, "DISPATCH_GENERATION": " 1"}, "error": "DISPATCH_GENERATION"},
    {"env": {**BASE, "SLURM_RESTART_COUNT": "1000000"}, "error": "SLURM_RESTART_COUNT"},
    {"env": {**BASE, "DISPATCH_GRACE": "301"}, "error": "DISPATCH_GRACE"},
    {"env": {**BASE, "DISPATCH_GRACE": "1e3"}, "error": "DISPATCH_GRACE"},
    {"env": {**BASE, "DISPATCH_SHARED_CHECKPOINT": "yes"}, "error": "DISPATCH_SHARED_CHECKPOINT"},
    {"env": {k: v for k, v in BASE.items() if k != "SLURM_JOB_ID"}, "error": "SLURM_JOB_ID"},
    {"env": {k: v for k, v in BASE.items() if k != "SLURM_CLUSTER_NAME"}, "error": "SLURM_CLUSTER_NAME"},
    {"env": {**BASE, "SLURM_ARRAY_TASK_ID": "x", "DISPATCH_CHECKPOINT": "/c/%a"}, "error": "SLURM_ARRAY_TASK_ID"},
    {"env": {**BASE, "SLURM_ARRAY_TASK_ID": "3"}, "error": "%a"},
    {"env": {**BASE, "DISPATCH_CHECKPOINT": "/ckpt/t-%a"}, "error": "not an array task"},
    {"env": {**BASE, "SLURM_ARRAY_TASK_ID": "3", "DISPATCH_CHECKPOINT": "/c/%a/x"}, "error": "last component"},
]

# epochs/<epoch, 20 digits>: "<attempt>\n", one token of that very epoch. A claim without
# its final newline (or empty) is incomplete: its writer is between create and write.
E1, E2 = epoch(0, 1, 0), epoch(1, 2, 0)
CLAIMS = {
    "names": [{"epoch": str(e), "name": f"{e:020d}"} for e in (E1, epoch(0, 1, 7), E2, epoch(99_999_999, 999_999, 999_999))],
    "contents": [
        *({"epoch": str(e), "data": f"{t}\n", "expect": f"claim {t}"} for e, t in [
            (E1, "linux.42.1000000"), (E2, "my_cluster.7.1000002000000"), (E1, "x" * 64 + ".1.1000000"),
            (E1, "c-1_x.123456789.1000000"), (E1, "a.00012345678901234567.1000000")]),
        *({"epoch": str(E1), "data": d, "expect": "incomplete"} for d in [
            "", "linux.42.1000000", "linux.42.10", "linux.42.1000000\nx", "\n\n\nx"]),
        *({"epoch": str(E1), "data": d, "expect": "bad"} for d in [
            "\n", "linux.42.2000000\n", "linux.42.01000000\n", "linux.42.1000000\n\n", "linux.42.1000000 \n",
            "x" * 65 + ".1.1000000\n", "linux..1000000\n", ".42.1000000\n", "linux.4a.1000000\n",
            "lin ux.42.1000000\n", "caf\u00e9.1.1000000\n", "linux.42\n", "linux.42.1000000.1000000\n",
            "a.123456789012345678901.1000000\n", "linux.42.100000\n", "linux.42.1000000\r\n"]),
    ],
}

# The view (--dispatch-view=DIR of the SPANK plugin): DIR as the path below the job's root, or
# the refusal. The root's own entries, by the contract's wording (docs/design.md's table), never
# a view; a test compares this list with dispatch_slurm/contract/layout.py and spank_env/layout.c.
OWN = ["ceased", "epochs", "events", "exec", "held", "jobs", "pinned", "pub", "record.jsonl", "requests",
       "retired", "sub", "supervisor"]


def view_error(view, kind, root="/ckpt/run1", own=None):
    inside = f"name a folder inside it (e.g. {root}/out)"
    return {"absolute": f"view folder '{view}' must be an absolute path",
            "dotdot": f"view folder '{view}' must not contain '..'",
            "long": f"view folder '{view}' is too long",
            "root": f"view folder '{view}' is the checkpoint root itself: {inside}",
            "outside": f"view folder '{view}' is not inside the checkpoint root {root}: {inside}",
            "own": f"view folder '{view}' is in {root}/{own}, dispatch-slurm's own folder: name another folder "
                   f"inside the root (e.g. {root}/out)"}[kind]


LONG = "/ckpt/run1/" + "/".join(["d" * 200] * 19) + "/" + "e" * 170  # 4,000 bytes: a view that fits
VIEW = {
    "own": OWN,
    "valid": [{"root": r, "view": v, "rel": rel} for r, v, rel in [
        ("/ckpt/run1", "/ckpt/run1/out", "out"),
        ("/ckpt/run1", "//ckpt/./run1//out/./", "out"),
        ("//ckpt/run1/", "/ckpt/run1/a/b/c", "a/b/c"),
        ("/ckpt/run1", "/ckpt/run1/out/exec", "out/exec"),
        ("/ckpt/run1", "/ckpt/run1/exec2", "exec2"),
        ("/ckpt/run1", "/ckpt/run1/.pub", ".pub"),
        ("/ckpt/run1", "/ckpt/run1/a\tb", "a\tb"),
        ("/ckpt/run1", "/ckpt/run1/$(touch x)", "$(touch x)"),
        ("/ckpt/run1", "/ckpt/run1/it's \"q\"", "it's \"q\""),
        ("/ckpt/run1", "/ckpt/run1/caf\u00e9", "caf\u00e9"),
        ("/ckpt/sweep/task-%a", "/ckpt/sweep/task-%a/out", "out"),
        ("/", "/scratch/out", "scratch/out"),
        ("/ckpt/run1", LONG, LONG[len("/ckpt/run1/"):]),
    ]],
    "errors": [
        {"root": "/ckpt/run1", "view": "out", "error": view_error("out", "absolute")},
        {"root": "/ckpt/run1", "view": "", "error": view_error("", "absolute")},
        {"root": "/ckpt/run1", "view": "/ckpt/run1/../etc", "error": view_error("/ckpt/run1/../etc", "dotdot")},
        {"root": "/ckpt/run1", "view": "/ckpt/run1", "error": view_error("/ckpt/run1", "root")},
        {"root": "/ckpt/run1", "view": "/ckpt/run1/./", "error": view_error("/ckpt/run1/./", "root")},
        {"root": "/ckpt/run1", "view": "/ckpt/run10/out", "error": view_error("/ckpt/run10/out", "outside")},
        {"root": "/ckpt/run1", "view": "/ckpt/out", "error": view_error("/ckpt/out", "outside")},
        {"root": "/ckpt/run1", "view": "/etc", "error": view_error("/etc", "outside")},
        {"root": "/ckpt/sweep/task-%a", "view": "/ckpt/sweep/task-1/out",
         "error": view_error("/ckpt/sweep/task-1/out", "outside", root="/ckpt/sweep/task-%a")},
        {"root": "/ckpt/run1", "view": LONG + "x" * 96, "error": view_error(LONG + "x" * 96, "long")},
        *({"root": "/ckpt/run1", "view": f"/ckpt/run1/{own}/out", "error": view_error(f"/ckpt/run1/{own}/out",
                                                                                    "own", own=own)}
          for own in OWN),
        {"root": "/ckpt/run1", "view": "/ckpt/run1/exec", "error": view_error("/ckpt/run1/exec", "own", own="exec")},
    ],
}

if __name__ == "__main__":
    dump("claims.json", CLAIMS)
    dump("epochs.json", EPOCHS)
    dump("names.json", NAMES)
    dump("tokens.json", TOKENS)
    dump("env.json", {"valid": ENV, "errors": ENV_ERRORS})
    dump("view.json", VIEW)
