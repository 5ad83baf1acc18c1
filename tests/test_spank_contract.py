"""The SPANK plugin's contract code (spank_env/contract.c) against the shared vectors:
the C side must give byte-identical values to the Python side for every case."""

import shutil
import subprocess

import pytest

from support import REPO, vectors

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                                reason="no C compiler")


@pytest.fixture(scope="module")
def contract(tmp_path_factory):
    """Build test_contract from the sources into a temp dir and run it as a server."""
    out = tmp_path_factory.mktemp("spank") / "test_contract"
    src = REPO / "spank_env"
    subprocess.run(["cc", "-O2", "-std=gnu11", "-Wall", "-Wextra", "-Werror", "-D_GNU_SOURCE", "-o", str(out),
                    str(src / "test_contract.c"), str(src / "contract.c")], check=True)
    proc = subprocess.Popen([str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(*fields, multiline=False):
        proc.stdin.write("\t".join(map(str, fields)) + "\n")
        proc.stdin.flush()
        if not multiline:
            return proc.stdout.readline().rstrip("\n")
        lines = []
        while (line := proc.stdout.readline().rstrip("\n")) != "end":
            lines.append(line)
        return lines

    yield ask
    proc.stdin.close()
    proc.wait(10)


def test_epochs(contract):
    v = vectors("epochs.json")
    for case in v["valid"]:
        assert contract("epoch", case["g"], case["n"], case["r"]) == str(case["epoch"])
    for case in v["invalid"]:
        got = contract("epoch", case["g"], case["n"], case["r"])
        assert got.startswith("error: ") and case["part"] in got, (case, got)


def test_names(contract):
    for case in vectors("names.json")["valid"]:
        assert contract("name", case["epoch"], case["step"], case["path"]) == case["name"]


def test_tokens(contract):
    v = vectors("tokens.json")
    for case in v["valid"]:
        assert contract("token", case["cluster"], case["job_id"], case["epoch"]) == case["token"]
    for case in v["invalid"][:4]:  # the last one is an invalid epoch, which C never formats
        assert contract("token", case["cluster"], case["job_id"], case["epoch"]).startswith("error: ")


def _env_request(case):
    fields = [f"{k}={v}" for k, v in case["env"].items()]
    if site := case.get("site"):
        fields.append(f"site.grace={site['grace']}")
        fields += [f"site.account.{a}={g}" for a, g in site["account_grace"].items()]
    return fields


@pytest.mark.parametrize("case", vectors("env.json")["valid"], ids=lambda c: c["name"])
def test_env(contract, case):
    lines = contract("env", *_env_request(case), multiline=True)
    assert dict(line.split("=", 1) for line in lines) == case["expect"]
    assert [line.split("=", 1)[0] for line in lines] == list(case["expect"])  # same order


@pytest.mark.parametrize("case", vectors("env.json")["errors"], ids=lambda c: c["error"])
def test_env_errors(contract, case):
    lines = contract("env", *_env_request(case), multiline=True)
    assert len(lines) == 1 and lines[0].startswith("error: ") and case["error"] in lines[0], lines
