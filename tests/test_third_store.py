"""A third store is one module and one line in the chooser.

``MemStore`` below is a whole store: the interface's primitives (dispatch_slurm/store/base.py)
over a dict in this process, conditional creates and all. Registering it is one line,
``SCHEMES`` in dispatch_slurm/store/roots.py. Then every layer works on a ``mem://`` root
unchanged: submission numbers, epoch claims, publish (its own saves, refusing another's),
watch, latest and the resume point, events, gc with its removal order, pins, the report and
the CLI. A layer that reached around the interface (a path test, an os call on the root,
a backend imported by name) fails here; tests/test_architecture.py forbids the same
statically."""

import re

import pytest
from click.testing import CliRunner

from dispatch_slurm import report, retention, store
from dispatch_slurm.cli import dispatch
from dispatch_slurm.contract import layout, names
from dispatch_slurm.errors import BadPath, StoreError
from dispatch_slurm.runtime import watch
from dispatch_slurm.store import epochs, events, roots

E1, E2 = 1_000_000, 2_000_000
A1, A2 = f"c.1.{E1}", f"c.2.{E2}"
ROOT = "mem://lab/run1"


class MemStore(store.Store):
    """Objects in a dict: key (the path under the root) -> bytes; a create that finds the key
    refuses, as O_EXCL and If-None-Match do."""

    kind = "mem://"
    data: dict[str, dict[str, bytes]] = {}
    clock = [1000.0]

    def __init__(self, root):
        super().__init__(root.rstrip("/"))
        self.keys = self.data.setdefault(self.root, {})
        self.times = self.data.setdefault(self.root + "#t", {})

    @classmethod
    def absolute(cls, value, from_env):
        return value.rstrip("/")

    def put(self, key, body=b"x"):
        self.clock[0] += 1
        self.keys[key], self.times[key] = body, self.clock[0]

    def _rel(self, path):
        return path[len(self.root) + 1:] if path.startswith(self.root + "/") else None

    def listing(self, folder):
        return sorted({k[len(folder) + 1:] for k in self.keys if k.startswith(folder + "/")})

    def read(self, folder, name, limit=None):
        body = self.keys.get(f"{folder}/{name}")
        return body if body is None or limit is None else body[:limit]

    def create(self, folder, name, body=b"", mode=0o444, sync_root=True):
        if f"{folder}/{name}" in self.keys:
            return False
        self.put(f"{folder}/{name}", body)
        return True

    def delete(self, folder, name):
        return self.keys.pop(f"{folder}/{name}", None) is not None

    def fill_empty(self, folder, name, body):
        old = self.keys[f"{folder}/{name}"]
        if not old:
            self.put(f"{folder}/{name}", body)
        return old

    def too_long(self, folder, name):
        return None

    def relpath(self, save):
        rel = self._rel(str(save).rstrip("/"))
        if rel is None:
            raise BadPath(f"save {save} is not inside the checkpoint root {self.root}")
        return names.check_relpath(rel)

    def save_relpath(self, save):
        rel = self.relpath(save)
        if not self.save_exists(rel):
            raise BadPath(f"save {save} does not exist")
        return rel

    def save_exists(self, rel):
        return any(k == rel or k.startswith(rel + "/") for k in self.keys)

    def publication_fits(self, name, rel):
        pass

    def create_publication(self, name):
        return self.create(layout.PUB, name)

    def make_exec_dir(self, attempt, mode=0o700, create_root=False):
        self.check_attempt(attempt)
        return f"{self.root}/{layout.exec_relpath(attempt)}"

    def add_event(self, name, line):
        self.put(f"{layout.EVENTS}/{name}.{len(self.keys)}.jsonl", line)

    def event_files(self, prefix=""):
        return [(n, self.read(layout.EVENTS, n)) for n in self.listing(layout.EVENTS) if n.startswith(prefix)]

    def inventory(self, pattern=names.STEP_PATTERN):
        folders = {}
        for k in self.keys:
            parts = k.split("/")
            if parts[0] == layout.EXEC and len(parts) > 2:
                f = folders.setdefault(parts[1], store.Folder())
                t = self.times[k]
                f.first, f.last, f.newest = min(f.first or t, t), max(f.last or t, t), max(f.newest, t)
                f.entries[parts[2]] = f.entries.get(parts[2], False) or len(parts) > 3
        marks = self.listing(layout.RETIRED)
        inv = self.finish_inventory(self.publications(), marks, folders, pattern, self.by_person(marks))
        for s in inv.saves.values():
            held = [k for k in self.keys if k == s.path or k.startswith(s.path + "/")]
            s.exists, s.size = bool(held), sum(len(self.keys[k]) for k in held)
        return inv

    def remove(self, rel, held=()):
        gone = [k for k in self.keys if k == rel or k.startswith(rel + "/")]
        return sum(len(self.keys.pop(k)) for k in gone)

    def entries(self, folder):
        rel = self._rel(folder)
        under = [k[len(rel) + 1:].split("/") for k in self.keys if k.startswith(rel + "/")] if rel else []
        return sorted({(p[0], len(p) > 1) for p in under})

    def exists(self, path):
        return self._rel(path) in self.keys

    def read_path(self, path):
        return self.keys.get(self._rel(path))

    def present(self, path):
        return self.save_exists(self._rel(path))


@pytest.fixture
def mem(monkeypatch):
    MemStore.data.clear()
    monkeypatch.setattr(roots, "SCHEMES", roots.SCHEMES + (("mem://", MemStore),))  # the one line
    return MemStore(ROOT)


def save(mem, attempt, step, complete=True):
    mem.put(f"exec/{attempt}/checkpoint-{step}/model.bin", b"w" * 100)
    if complete:
        mem.put(f"exec/{attempt}/checkpoint-{step}/COMPLETE", b"")
    return f"{ROOT}/exec/{attempt}/checkpoint-{step}"


def as_execution(monkeypatch, attempt):
    monkeypatch.setenv("DISPATCH_CHECKPOINT", ROOT)
    monkeypatch.setenv("DISPATCH_ATTEMPT", attempt)
    monkeypatch.setenv("DISPATCH_EPOCH", str(names.attempt_epoch(attempt)))


def test_every_layer_works_on_a_third_store_through_the_interface(mem, monkeypatch):
    assert store.at(ROOT).__class__ is MemStore
    assert [store.allocate_submission(ROOT) for _ in range(2)] == [1, 2]
    for attempt in (A1, A2):
        epochs.claim(store.at(ROOT), attempt)
    with pytest.raises(epochs.EpochClaimed):
        epochs.claim(store.at(ROOT), f"c.9.{E1}")  # another job at epoch E1: refused

    as_execution(monkeypatch, A1)  # the old execution publishes 100 and 200
    for step in (100, 200):
        store.publish(save(mem, A1, step))
    with pytest.raises(BadPath, match="written by execution"):
        store.publish(save(mem, A2, 250))  # not its own save

    as_execution(monkeypatch, A2)  # the replacement resumes from 200, watch publishes its 300
    assert store.latest_save(ROOT).step == 200
    save(mem, A2, 300)
    save(mem, A2, 350, complete=False)
    w = watch.Watcher(f"{ROOT}/exec/{A2}", ROOT, E2, watch.Layout(marker="COMPLETE"))
    assert [p.step for p in w.scan()] == [250, 300] and w.pending == ["checkpoint-350"]

    as_execution(monkeypatch, A1)  # the old one keeps going: a late, higher step at its epoch
    store.publish(save(mem, A1, 400))
    assert (store.latest(ROOT).epoch, store.latest(ROOT).step) == (E2, 300)
    assert {e["type"] for e in events.read(ROOT)} == {"published"}

    assert retention.pin(ROOT, f"{ROOT}/exec/{A1}/checkpoint-100") == (f"exec/{A1}/checkpoint-100", True)
    verdicts = {v.save.path: v for v in retention.collect(ROOT, retention.Policy(keep_last=1, min_age=0),
                                                          {A1: (True, "test"), A2: (True, "test")})}
    removed = sorted(p for p, v in verdicts.items() if v.action == retention.REMOVE)
    assert removed == [f"exec/{A1}/checkpoint-200", f"exec/{A1}/checkpoint-400", f"exec/{A2}/checkpoint-250",
                       f"exec/{A2}/checkpoint-350"]
    assert verdicts[f"exec/{A1}/checkpoint-100"].why == "pinned"
    assert not mem.save_exists(f"exec/{A1}/checkpoint-400") and mem.save_exists(f"exec/{A2}/checkpoint-300")
    assert len(mem.listing(layout.RETIRED)) == 4 and store.latest_save(ROOT).step == 300

    r = report.build(ROOT)
    assert [e["attempt"] for e in r["executions"]] == [A1, A2] and r["latest"]["step"] == 300
    assert r["retention"]["totals"]["retired"]["saves"] == 4

    out = CliRunner().invoke(dispatch, ["latest", ROOT, "--resume"])
    assert out.exit_code == 0 and out.output.strip() == f"{ROOT}/exec/{A2}/checkpoint-300"
    out = CliRunner().invoke(dispatch, ["ls", ROOT])
    assert out.exit_code == 0 and re.search(r"300 +yes .* latest +exec/c\.2\.2000000/checkpoint-300", out.output)


def test_the_supervisor_refuses_a_store_that_cannot_append(mem):
    from dispatch_slurm import supervisor
    with pytest.raises(StoreError, match="the supervisor needs a POSIX root.*mem:// roots serve"):
        supervisor.normalize(ROOT)
