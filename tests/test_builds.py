"""Builds as the inventory and the command line give them (cache_qualify.config.builds): names kept as typed,
${VAR} expanded, the three sources, and builds given whole by --baseline/--candidate."""

from __future__ import annotations

from pathlib import Path

import pytest

from cache_qualify.config.inventory import load_inventory
from cache_qualify.errors import InventoryError
from cache_qualify.urls import UNPARSEABLE, masked_argv
from tests.support.labfixtures import edited, run_qualify, write_file, write_inventory

BASE = """\
lab: test-lab
hosts:
  - {name: a, address: 127.0.0.21, rank: 0}
server:
  runtime: flare
  command: "{build_path} --port {port} {flags}"
  http_port: 18000
builds:
  set4: {path: /opt/b/set4/server, flags: [--x, "1"], description: the baseline, cost: none}
  two_choice: {path: /opt/b/tc/server, ref: abc123}
baseline: set4
candidate: two_choice
"""


def inventory_text(tmp_path: Path, text: str, **options: str) -> object:
    return load_inventory(write_file(tmp_path, text, "hosts.yaml"), **options)


@pytest.mark.parametrize(("typed", "ref"), [("20251207", "20251207"), ("0123", "0755"), ("1e5", "1.10")])
def test_build_names_and_refs_stay_as_typed(tmp_path: Path, typed: str, ref: str) -> None:
    """A short SHA of digits is a name, a leading 0 no octal number, a ref no float: the text typed."""
    text = edited(BASE, "  two_choice: {path: /opt/b/tc/server, ref: abc123}",
                  f"  {typed}: {{path: /opt/b/tc/server, ref: {ref}}}").replace("candidate: two_choice",
                                                                                  f"candidate: {typed}")
    inventory = load_inventory(write_file(tmp_path, text, "hosts.yaml"))
    assert inventory.candidate == typed
    assert list(inventory.builds) == ["set4", typed]
    assert inventory.builds[typed].ref == ref
    listed = load_inventory(write_file(tmp_path, text.replace(f"candidate: {typed}", f"candidate: [{typed}]"),
                                       "list.yaml"))
    assert listed.candidates == (typed,)


def test_variables_expand_in_build_fields(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PR_SHA", "0c0ffee")
    monkeypatch.setenv("PR_FLAG", "--pr")
    text = edited(BASE, "  two_choice: {path: /opt/b/tc/server, ref: abc123}",
                  "  two_choice: {path: '/opt/b/${PR_SHA}/server', ref: '${PR_SHA}', flags: ['${PR_FLAG}', '$$HOME']}")
    build = load_inventory(write_file(tmp_path, text, "hosts.yaml")).builds["two_choice"]
    assert (build.path, build.ref, build.flags) == ("/opt/b/0c0ffee/server", "0c0ffee", ("--pr", "$HOME"))


def test_unset_variable_refused_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CQ_UNSET_FOR_TEST", raising=False)
    text = edited(BASE, "ref: abc123", "ref: '${CQ_UNSET_FOR_TEST}'")
    with pytest.raises(InventoryError, match=r"hosts\.yaml:10: builds\.two_choice\.ref: \$\{CQ_UNSET_FOR_TEST\} "
                                             r"is not set in the runner's environment") as info:
        load_inventory(write_file(tmp_path, text, "hosts.yaml"))
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(("old", "new", "match"), [
    ("two_choice: {path: /opt/b/tc/server, ref: abc123}", "two_choice: {path: /x, artifact: ./y}",
     r"builds\.two_choice: expected exactly one source of `path`, `artifact` or `image`, found path and artifact"),
    ("two_choice: {path: /opt/b/tc/server, ref: abc123}", "two_choice: {image: 'reg/x@sha256:12'}",
     r"builds\.two_choice\.image: expected repo@sha256: and 64 hex digits"),
    ("two_choice: {path: /opt/b/tc/server, ref: abc123}", "two_choice: {path: /x, sha256: abc}",
     r"builds\.two_choice\.sha256: expected 64 lowercase hex digits"),
    ("two_choice: {path: /opt/b/tc/server, ref: abc123}", "two_choice: {artifact: ./x, sha256: " + "a" * 64 + "}",
     r"builds\.two_choice\.sha256: `sha256` declares what a `path` must hold"),
])
def test_wrong_sources_refused(tmp_path: Path, old: str, new: str, match: str) -> None:
    with pytest.raises(InventoryError, match=match):
        load_inventory(write_file(tmp_path, edited(BASE, old, new), "hosts.yaml"))


def test_candidate_given_whole_on_the_command_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NAME=LIKE@artifact:PATH: a new build with LIKE's flags and description, the artifact resolved against
    the working folder, the pipeline's commit as its ref; the same for --baseline with an image."""
    monkeypatch.setenv("CI_COMMIT_SHA", "5eed" * 10)
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "server").write_text("#!/bin/sh\n")
    inventory = load_inventory(write_file(tmp_path, BASE, "hosts.yaml"), candidate="0421=set4@artifact:out/server",
                               baseline="main=set4@image:127.0.0.1:5000/flare:main")
    assert (inventory.baseline, inventory.candidate) == ("main", "0421")
    given = inventory.builds["0421"]
    assert (given.artifact, given.flags, given.description, given.ref) == (
        str(tmp_path / "out" / "server"), ("--x", "1"), "the baseline", "5eed" * 10)
    assert inventory.builds["main"].image == "127.0.0.1:5000/flare:main"


@pytest.mark.parametrize(("option", "value", "match"), [
    ("candidate", "pr=set4", r"--candidate: expected NAME=LIKE@artifact:PATH or NAME=LIKE@image:REF, found 'pr=set4'"),
    ("candidate", "pr=nope@artifact:x", r"--candidate: unknown build 'nope' after '='"),
    ("candidate", "set4=set4@image:reg/x:1", r"--candidate: build 'set4' is already in the inventory"),
    ("baseline", "pr=set4@docker:reg/x:1", r"--baseline: expected artifact:PATH or image:REF after '@', found 'docker"),
    ("baseline", "-x=set4@image:reg/x:1", r"--baseline: expected NAME of letters"),
    ("candidate", "pr=set4@artifact:no/such/file", r"--candidate: artifact 'no/such/file' of build 'pr' not found"),
    ("candidate", "pr=set4@image:reg/x@sha256:1", r"--candidate: expected repo@sha256: and 64 hex digits"),
    ("candidate", "pr=set4@image:reg/x:1,pr=set4@image:reg/x:2", r"--candidate: build 'pr' is already in the"),
])
def test_wrong_command_line_builds_refused_in_one_line(tmp_path: Path, option: str, value: str, match: str) -> None:
    with pytest.raises(InventoryError, match=match) as info:
        load_inventory(write_file(tmp_path, BASE, "hosts.yaml"), **{option: value})
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("image", ["robot:s3cret@registry.lab/flare:pr", "https://robot:s3cret@registry.lab/flare:pr"])
def test_a_registry_login_in_an_image_reference_is_refused_and_never_recorded(tmp_path: Path, image: str) -> None:
    """Credentials come from the engine's own login or its environment: one typed into a reference is refused
    in one line that does not repeat the password, in the inventory and on the command line, and a run given
    one records it nowhere (its output, its reports folder), the recorded command line masking it. Cost: 8 s each."""
    said = r"expected an image reference without credentials, found robot:\*\*\*@\.\.\.: log the engine in"
    with pytest.raises(InventoryError, match=rf"^\S+hosts\.yaml: builds: --candidate: {said}") as given:
        inventory_text(tmp_path, BASE, candidate=f"pr=set4@image:{image}")
    with pytest.raises(InventoryError, match=rf"^\S+hosts\.yaml:10: builds\.two_choice\.image: {said}") as typed:
        inventory_text(tmp_path, edited(BASE, "two_choice: {path: /opt/b/tc/server, ref: abc123}",
                                        f"two_choice: {{image: '{image}'}}"))
    assert "s3cret" not in str(given.value) + str(typed.value)
    recorded = masked_argv(["--candidate", f"pr=set4@image:{image}"])[1]   # the plan's command line
    assert "s3cret" not in recorded and ("robot:***@registry.lab" in recorded or recorded == UNPARSEABLE), recorded
    run = run_qualify(write_inventory(tmp_path), tmp_path / "reports", "--candidate", f"pr=set4@image:{image}",
                      timeout_s=120)
    assert run.returncode != 0 and "without credentials" in run.output, run.output[-3000:]
    written = [p for p in (tmp_path / "reports").rglob("*") if p.is_file() and b"s3cret" in p.read_bytes()]
    assert "s3cret" not in run.output and written == [], written
