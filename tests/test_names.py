"""Epochs, publication names and tokens: the shared vectors, then properties."""

import base64
import os
import string

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dispatch_slurm.contract import epoch, names
from dispatch_slurm.errors import BadName, BadPath, EnvError, EpochError

from support import vectors

EPOCHS, NAMES, TOKENS = vectors("epochs.json"), vectors("names.json"), vectors("tokens.json")


@pytest.mark.parametrize("v", EPOCHS["valid"], ids=lambda v: str(v["epoch"]))
def test_epoch_vectors(v):
    assert epoch.compose(v["g"], v["n"], v["r"]) == v["epoch"]
    assert tuple(epoch.decompose(v["epoch"])) == (v["g"], v["n"], v["r"])


@pytest.mark.parametrize("v", EPOCHS["invalid"], ids=lambda v: f'{v["g"]},{v["n"]},{v["r"]}')
def test_epoch_refuses_and_names_the_part(v):
    with pytest.raises(EpochError, match=v["part"]) as e:
        epoch.compose(v["g"], v["n"], v["r"])
    assert "out of range" in str(e.value)


@pytest.mark.parametrize("value", EPOCHS["invalid_epochs"])
def test_decompose_refuses(value):
    with pytest.raises(EpochError):
        epoch.decompose(value)


@pytest.mark.parametrize("bad", [True, 1.0, "1", None])
def test_epoch_parts_must_be_integers(bad):
    with pytest.raises(EpochError, match="integer"):
        epoch.compose(0, bad, 0)


@pytest.mark.parametrize("v", NAMES["valid"], ids=lambda v: v["path"])
def test_name_vectors(v):
    assert names.encode(v["epoch"], v["step"], v["path"]) == v["name"]
    assert names.parse(v["name"]) == (v["epoch"], v["step"], v["path"], v["name"])
    assert names.all_valid([v["name"]])


@pytest.mark.parametrize("bad", NAMES["invalid_names"])
def test_bad_names_raise_naming_the_entry(bad):
    with pytest.raises(BadName) as e:
        names.parse(bad, where="/r/pub")
    assert repr(bad) in str(e.value) and "/r/pub" in str(e.value)
    good = NAMES["valid"][0]["name"]
    assert not names.all_valid([good, bad, good])


@pytest.mark.parametrize("path", NAMES["invalid_paths"])
def test_bad_save_paths_refused(path):
    with pytest.raises(BadPath):
        names.encode(1_000_000, 1, path)


@pytest.mark.parametrize("v", TOKENS["valid"], ids=lambda v: v["token"])
def test_token_vectors(v):
    assert names.attempt_token(v["cluster"], v["job_id"], v["epoch"]) == v["token"]


@pytest.mark.parametrize("v", TOKENS["invalid"])
def test_token_refuses(v):
    with pytest.raises((EnvError, EpochError)):
        names.attempt_token(v["cluster"], v["job_id"], v["epoch"])


# ---- properties ----------------------------------------------------------------

component = st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)),
                    min_size=1, max_size=12).filter(lambda c: c not in (".", ".."))
relpath = st.lists(component, min_size=1, max_size=5).map("/".join)
epochs = st.builds(epoch.compose, st.integers(0, epoch.G_MAX), st.integers(1, epoch.N_MAX),
                   st.integers(0, epoch.R_MAX))
steps = st.integers(0, names.STEP_MAX)


@given(epochs, steps, relpath)
def test_round_trip(e, s, p):
    name = names.encode(e, s, p)
    assert names.parse(name) == (e, s, p, name)


@given(epochs, steps, relpath)
def test_alphabet(e, s, p):
    b32 = names.encode(e, s, p).split("-", 2)[2]
    assert set(b32) <= set(string.ascii_uppercase + "234567")
    assert "=" not in b32 and "-" not in b32
    assert base64.b32decode(b32 + "=" * (-len(b32) % 8)) == os.fsencode(p)


@given(st.lists(st.tuples(epochs, steps, relpath), min_size=2, max_size=30, unique_by=lambda t: t[2]))
def test_name_order_is_epoch_step_order(items):
    by_name = [names.parse(n)[:2] for n in sorted(names.encode(*t) for t in items)]
    assert by_name == sorted(by_name)


def _parses(name):
    try:
        names.parse(name)
        return True
    except BadName:
        return False


@st.composite
def mutated(draw):
    """A valid name with one edit: a character replaced, inserted or deleted."""
    name = names.encode(draw(epochs), draw(steps), draw(relpath))
    i = draw(st.integers(0, len(name)))
    kind = draw(st.sampled_from(["replace", "insert", "delete"]))
    ch = draw(st.characters(max_codepoint=0x2FF, blacklist_categories=("Cs",)))
    if kind == "replace" and i < len(name):
        return name[:i] + ch + name[i + 1:]
    if kind == "delete" and i < len(name):
        return name[:i] + name[i + 1:]
    return name[:i] + ch + name[i:]


@settings(max_examples=1500)
@given(mutated())
@example("00000000000001000000-00000000000000000005-ME")
def test_mutations_are_refused_or_still_canonical(name):
    """Every string either parses to a canonical name (re-encoding gives it back) or
    raises BadName naming it; and the bulk validator agrees with parse()."""
    try:
        p = names.parse(name)
    except BadName as e:
        assert repr(name) in str(e)
        assert not names.all_valid([name])
    else:
        assert names.encode(p.epoch, p.step, p.path) == name
        assert names.all_valid([name])


@settings(max_examples=300)
@given(st.lists(st.one_of(mutated(), st.builds(names.encode, epochs, steps, relpath)), max_size=20))
def test_bulk_validation_agrees_with_parse(entries):
    assert names.all_valid(entries) == all(map(_parses, entries))


@settings(max_examples=1000)
@given(st.binary(min_size=1, max_size=40))
def test_bulk_agrees_on_arbitrary_decoded_bytes(raw):
    """Any bytes as a path (NULs, slashes, dots, non-UTF-8): both validators agree."""
    name = f"{1_000_000:020d}-{1:020d}-" + base64.b32encode(raw).decode().rstrip("=")
    assert names.all_valid([name]) == _parses(name)


@settings(max_examples=1000)
@given(st.lists(st.one_of(st.binary(max_size=12).map(lambda b: base64.b32encode(b).decode().rstrip("=")),
                          st.text(alphabet=names._B32, max_size=24)), min_size=1, max_size=6))
def test_bulk_agrees_on_lists_of_any_base32_paths(paths):
    """Several paths decoded side by side (separators between them), including
    non-canonical tail bits next to NUL bytes: still the per-entry verdict."""
    entries = [f"{1_000_000:020d}-{i:020d}-{p}" for i, p in enumerate(paths)]
    assert names.all_valid(entries) == all(map(_parses, entries))


@pytest.mark.parametrize("bad_at", [None, 0, 4095, 4096, 9999])
def test_bulk_spans_chunks(bad_at):
    entries = [names.encode(1_000_000 + i % 3, i, f"run/checkpoint-{i}") for i in range(10_000)]
    if bad_at is not None:
        entries[bad_at] = names.encode(1_000_000, bad_at, "a")[:-1] + "B"  # tail bits set
    assert names.all_valid(entries) == (bad_at is None)


def test_bulk_long_path_agrees():
    name = names.encode(1_000_000, 1, "d/" * 150 + "x")  # longer than NAME_MAX: parse has no limit
    assert _parses(name) and names.all_valid([name])
