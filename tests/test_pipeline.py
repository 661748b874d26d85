"""The pipeline a run belongs to, from GitLab CI's and GitHub Actions' variables (`cache_qualify.session.pipeline`);
what a run records of it is checked end to end by tests/test_ci_examples.py."""

from __future__ import annotations

from cache_qualify.samples.ci import PipelineRecord
from cache_qualify.session.pipeline import pipeline_facts

GITLAB = {"GITLAB_CI": "true", "CI_COMMIT_SHA": "0123456789abcdef0123", "CI_COMMIT_REF_NAME": "rowcache-two-choice",
          "CI_PIPELINE_ID": "8841", "CI_JOB_URL": "https://gitlab.example/lab/runtime/-/jobs/99",
          "CI_MERGE_REQUEST_IID": "17"}
GITHUB = {"GITHUB_ACTIONS": "true", "GITHUB_SHA": "fedcba9876543210fedc", "GITHUB_REF": "refs/pull/42/merge",
          "GITHUB_HEAD_REF": "two-choice", "GITHUB_RUN_ID": "7001", "GITHUB_SERVER_URL": "https://github.com",
          "GITHUB_REPOSITORY": "lab/runtime"}


def test_gitlab_variables() -> None:
    assert pipeline_facts(GITLAB) == PipelineRecord("gitlab", "0123456789abcdef0123", "rowcache-two-choice", "8841",
                                                    "https://gitlab.example/lab/runtime/-/jobs/99", "17")
    push = pipeline_facts({**GITLAB, "CI_MERGE_REQUEST_IID": ""})
    assert push is not None and push.merge_request is None


def test_github_variables_of_a_pull_request_and_of_a_push() -> None:
    found = pipeline_facts(GITHUB)
    assert found == PipelineRecord("github", "fedcba9876543210fedc", "two-choice", "7001",
                                   "https://github.com/lab/runtime/actions/runs/7001", "42")
    assert found.properties()[:2] == [("pipeline_ci", "github"), ("pipeline_commit", "fedcba9876543210fedc")]
    assert found.lines() == ["github pipeline 7001, ref `two-choice` at `fedcba987654`, pull request #42, "
                             "[job](https://github.com/lab/runtime/actions/runs/7001)"]
    push = pipeline_facts({**GITHUB, "GITHUB_REF": "refs/heads/main", "GITHUB_HEAD_REF": ""})
    assert push is not None and (push.ref, push.merge_request) == ("main", None)


def test_outside_a_pipeline_nothing_is_read() -> None:
    assert pipeline_facts({"CI": "true", "HOME": "/root"}) is None
