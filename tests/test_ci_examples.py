"""The CI examples run as written: each script line of examples/ci/gitlab-ci.yml and each `run` line of
examples/ci/github-workflow.yml, word for word, with the pipeline's variables set, in a repository holding only
the lab's inventory (the simulated lab's), with the gate installed from a wheel (`pip install`, as the examples
do). Each exits 0 with every verdict PASS and leaves JUnit, the run folder, the comment file and (GitHub) the step
summary. The two pipelines write one shared history: `history runs` shows each run's ref, commit and merge
request, the page lists the runs by merge request, and provenance.json, JUnit and summary.md carry the pipeline."""

from __future__ import annotations

import json
import re
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.installed import FreshEnvironment, lab_folder
from tests.support.labfixtures import REPO, small_scenario

EXAMPLES = REPO / "examples" / "ci"
GITLAB = {"GITLAB_CI": "true", "CI": "true", "CI_COMMIT_SHA": "0123456789abcdef0123456789abcdef01234567",
          "CI_COMMIT_SHORT_SHA": "01234567",
          "CI_COMMIT_REF_NAME": "rowcache-two-choice", "CI_PIPELINE_ID": "8841", "CI_JOB_ID": "99",
          "CI_JOB_URL": "https://gitlab.example/lab/runtime/-/jobs/99", "CI_MERGE_REQUEST_IID": "17",
          "CI_PIPELINE_SOURCE": "merge_request_event"}
GITHUB = {"GITHUB_ACTIONS": "true", "CI": "true", "GITHUB_SHA": "fedcba9876543210fedcba9876543210fedcba98",
          "GITHUB_REF": "refs/pull/42/merge", "GITHUB_HEAD_REF": "two-choice", "GITHUB_RUN_ID": "7001",
          "GITHUB_RUN_ATTEMPT": "1", "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "lab/runtime",
          "GITHUB_EVENT_NAME": "pull_request"}


def literal(values: dict[str, Any]) -> dict[str, str]:
    """The variables an example sets itself, but those it takes from the CI's secrets (set by the test)."""
    return {k: str(v) for k, v in values.items() if "${{" not in str(v)}


def run_lines(venv: FreshEnvironment, lines: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The lines, word for word, in one shell that stops at the first that fails (as GitLab's runner does)."""
    return venv.run(["bash", "-eo", "pipefail", "-c", "\n".join(lines)], cwd, env=env)


def repository(tmp_path: Path, name: str, venv: FreshEnvironment) -> Path:
    """A runtime's repository holding only the lab's inventory, in lab/hosts.yaml."""
    root = tmp_path / name
    root.mkdir()
    server = venv.package_file(tmp_path, "cache_qualify").parent / "sim" / "server.py"
    lab_folder(root / "lab", server)
    (root / "out").mkdir()   # the build job's artifact: the pull request's server, staged onto every host
    (root / "out" / "flare-server").write_bytes(server.read_bytes() + f"# {name}\n".encode())
    return root


def check_run(root: Path, run_id: str, pipeline: dict[str, str]) -> None:
    """Exit 0's leftovers: JUnit with every verdict PASS and the pipeline's properties, the run folder with the
    pipeline in provenance.json and summary.md, and the comment, outcome first, under GitHub's limit."""
    junit = ET.parse(root / "junit.xml").getroot()
    verdicts = [c for c in junit.iter("testcase")
                if any(p.get("name") == "outcome" for p in c.iter("property"))]
    assert verdicts and all({p.get("name"): p.get("value") for p in c.iter("property")}["outcome"] == "pass"
                            for c in verdicts), ET.tostring(junit)[:3000]
    suite = {p.get("name"): p.get("value") for p in junit.find("testsuite").find("properties")}  # type: ignore[union-attr]
    assert suite["run_outcome"] == "pass" and suite["pipeline_commit"] == pipeline["commit"], suite
    run_dir = root / "reports" / run_id
    provenance = json.loads((run_dir / "provenance.json").read_text())
    assert provenance["pipeline"]["merge_request"] == pipeline["merge_request"], provenance["pipeline"]
    assert f"at `{pipeline['commit'][:12]}`" in (run_dir / "summary.md").read_text()
    comment = (run_dir / "comment.md").read_text()
    assert len(comment) < 65_536 and comment.startswith(f"### cache-qualify `{run_id}`: PASS"), comment[:500]
    assert "**May merge**" in comment and "Predicted beside measured" in comment and "| PASS |" in comment, comment


def staged(root: Path, build: str) -> None:
    """The candidate was the build job's artifact, given whole on the command line: staged by its sha256, whose
    digest JUnit records for the arm."""
    import hashlib

    junit = ET.parse(root / "junit.xml").getroot()
    suite = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert suite.get(f"build[{build}].source") == "artifact", suite
    assert suite.get(f"build[{build}].digest") == hashlib.sha256((root / "out" / "flare-server").read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.xdist_group("wheel")
def test_the_ci_examples_run_as_written(tmp_path: Path, installed_gate: FreshEnvironment, built_wheel: Path) -> None:
    history = f"sqlite:///{tmp_path / 'shared-history.sqlite'}"
    scenario = small_scenario(tmp_path, "ci-short")   # the lab's choice of scenario: two trials per build
    given = {"CACHE_QUALIFY_PACKAGE": str(built_wheel), "QUALIFY_HISTORY": history, "QUALIFY_SCENARIO": str(scenario)}

    job = yaml.safe_load((EXAMPLES / "gitlab-ci.yml").read_text())["qualify-rowcache"]
    root = repository(tmp_path, "gitlab", installed_gate)
    done = run_lines(installed_gate, job["script"], root, {**GITLAB, **literal(job["variables"]), **given})
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    check_run(root, "8841-99", {"commit": GITLAB["CI_COMMIT_SHA"], "merge_request": "17"})
    staged(root, "mr-01234567")

    workflow = yaml.safe_load((EXAMPLES / "github-workflow.yml").read_text())["jobs"]["qualify"]
    root = repository(tmp_path, "github", installed_gate)
    summary = tmp_path / "step-summary.md"
    env = {**GITHUB, **literal(workflow["env"]), **given, "GITHUB_STEP_SUMMARY": str(summary)}
    for step in workflow["steps"]:
        if "run" in step:
            done = run_lines(installed_gate, [step["run"]], root, env)
            assert done.returncode == 0, (step["name"], (done.stdout + done.stderr)[-6000:])
    check_run(root, "7001-1", {"commit": GITHUB["GITHUB_SHA"], "merge_request": "42"})
    staged(root, "pr-fedcba98")
    assert summary.read_text().startswith("# cache-qualify run `7001-1`: PASS"), summary.read_text()[:500]
    commented = next(s for s in workflow["steps"] if "sticky-pull-request-comment" in s.get("uses", ""))
    assert re.sub(r"\$\{\{ github\.run_(id|attempt) \}\}", lambda m: {"id": "7001", "attempt": "1"}[m[1]],
                  commented["with"]["path"]) == "reports/7001-1/comment.md"

    # one history for both pipelines: each run's ref, commit and merge request; the page, by merge request
    listed = installed_gate.run(["cache-qualify", "history", "runs", "--history", history], tmp_path)
    assert listed.returncode == 0, listed.stderr
    for ref, commit, request in (("rowcache-two-choice", "0123456789ab", "17"), ("two-choice", "fedcba987654", "42")):
        assert re.search(rf"\| {ref} \| {commit} \| {request} \|", listed.stdout), listed.stdout
    page = installed_gate.run(["cache-qualify", "history", "html", "--history", history, str(tmp_path / "page"),
                               "--reports-dir", str(tmp_path)], tmp_path)
    assert page.returncode == 0, page.stderr
    text = Path(page.stdout.strip()).read_text()
    assert '<table id="merge-requests">' in text and 'data-merge-request="17"' in text and \
        'data-merge-request="42"' in text, text[:3000]


def test_the_readme_shows_the_gitlab_jobs_script_as_the_example_has_it() -> None:
    """The README's CI lines are the example's (which the test above runs), word for word."""
    script = yaml.safe_load((EXAMPLES / "gitlab-ci.yml").read_text())["qualify-rowcache"]["script"]
    readme = (REPO / "README.md").read_text()
    assert "\n".join(f"    - {line}" for line in script) in readme
