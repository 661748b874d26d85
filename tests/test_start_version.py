"""Where a server states its version only in an answer (SGLang's /server_info `version`, entrypoints/http_server.py
:863-889 of 0.5.23), a start asks it once ready and keeps it beside its log; the prediction reads it from there
(runfolder.read_start_version) and a start that answered none is kept as stating none. Against a real HTTP
server on loopback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from cache_qualify.samples import runfolder
from cache_qualify.trials.startfacts import answered_version
from tests.support.httpfixtures import Reply, StubServer, json_reply

HOST = "127.0.0.61"


def test_the_version_a_server_answers_is_read_at_its_field(stub_servers: Callable[[str], StubServer]) -> None:
    server = stub_servers(HOST)
    server.serve("/server_info", json_reply({"version": "0.5.23", "internal_states": [{}], "frontend": "python"}))
    assert answered_version(f"{server.url}/server_info", "version") == "0.5.23"


def test_a_server_that_answers_no_version_states_none(stub_servers: Callable[[str], StubServer]) -> None:
    server = stub_servers(HOST)
    server.serve("/server_info", json_reply({"frontend": "python"}))
    server.serve("/gone", Reply(status=404, body="not found"))
    assert answered_version(f"{server.url}/server_info", "version") == ""
    assert answered_version(f"{server.url}/gone", "version") == ""
    assert [r.path for r in server.requests] == ["/server_info", "/gone"]


def test_a_kept_version_is_read_back_for_its_start_only(tmp_path: Path) -> None:
    runfolder.logs_dir(tmp_path).mkdir(parents=True, exist_ok=True)
    runfolder.write_start_version(tmp_path, "reread-b-t0-a3", "gpu0", 0, "0.5.23")
    assert runfolder.read_start_version(tmp_path, "a3") == "0.5.23"
    assert runfolder.read_start_version(tmp_path, "a4") == ""
