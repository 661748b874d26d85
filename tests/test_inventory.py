"""Tests of cache_qualify.config.inventory: the committed inventories, malformed ones (each error matched), command quoting."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from cache_qualify.errors import InventoryError
from cache_qualify.config.inventory import (Host, Inventory, check_address, inventory_hash, json_schema, load_inventory,
                                render_argv, render_command)
from cache_qualify.config import yamlsource
from cache_qualify.config.scenario import SCENARIO_DIR
from cache_qualify.config.yamlsource import load_yaml
from tests.support.labfixtures import REPO, edited, run_cli, write_file


# A small valid inventory; each malformed case edits one piece of its text, so
# the expected line numbers are those of this text.
BASE = """\
lab: test-lab
ssh:
  user: qualify
  host_key_policy: strict
  jump: {address: bastion.example.com, port: 2222}
hosts:
  - name: a
    address: 127.0.0.21
    rank: 0
  - name: b
    address: 127.0.0.22
    port: 2022
    rank: 1
server:
  runtime: flare
  command: "{build_path} --rank {rank} --port {port} {flags}"
  http_port: 18000
  kv_pages: {metric: flare_kv_cache_pages}
builds:
  set4: {path: /opt/b/set4/server, flags: [--x, "1"], description: the baseline}
  two_choice: {path: /opt/b/tc/server, ref: abc123}
baseline: set4
candidate: two_choice
"""


def write(tmp_path: Path, text: str, name: str = "hosts.yaml") -> Path:
    return write_file(tmp_path, text, name)


def edit(old: str, new: str) -> str:
    return edited(BASE, old, new)


def test_base_inventory_is_valid(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, BASE))
    assert [h.name for h in inventory.hosts] == ["a", "b"]
    assert inventory.hosts[1].port == 2022 and inventory.hosts[0].port == 22
    assert inventory.hosts[0].transport == "ssh"
    assert inventory.ssh.jump is not None and inventory.ssh.jump.port == 2222
    assert inventory.build("set4").flags == ("--x", "1")
    assert inventory.server.readiness.path is None and inventory.measurement.readiness_path == "/health"
    assert "sudo -n" in inventory.server.drop_caches


# (id, old text, new text, regex the one-line error must match, line it must name).
# Lines of BASE: 1 lab, 2 ssh, 4 host_key_policy, 5 jump, 6 hosts, 7-9 host a, 10-13 host b
# (10 name, 11 address, 12 port, 13 rank), 14 server, 15 command, 17 kv_pages, 18 builds,
# 19 set4, 20 two_choice, 21 baseline, 22 candidate.
MALFORMED: list[tuple[str, str, str, str, int | None]] = [
    ("missing-lab", "lab: test-lab\n", "", r"hosts\.yaml:1: lab: required field is missing", 1),
    ("missing-rank", "    rank: 1\n", "", r":10: hosts\[1\]\.rank: required field is missing", 10),
    ("rank-as-string", "rank: 1", 'rank: "1"',
     r"hosts\[1\]\.rank: expected an integer.*found '1'", 13),
    ("rank-negative", "rank: 1", "rank: -1",
     r"hosts\[1\]\.rank: expected a value greater than or equal to 0", 13),
    ("port-too-big", "port: 2022", "port: 70000",
     r"hosts\[1\]\.port: .*less than or equal to 65535, found 70000", 12),
    ("port-bool", "port: 2022", "port: yes", r"hosts\[1\]\.port: expected an integer.*True", 12),
    ("unknown-build", "baseline: set4", "baseline: set5",
     r":22: baseline: unknown build 'set5' \(did you mean 'set4'\?\); known builds: set4, two_choice", 22),
    ("unknown-candidate", "candidate: two_choice", "candidate: twochoice",
     r"candidate: unknown build 'twochoice' \(did you mean 'two_choice'\?\); known builds: set4, two_choice", 23),
    ("duplicate-rank", "rank: 1", "rank: 0",
     r"hosts\[1\]\.rank: duplicate rank 0 in group 'default': already used by a; expected ranks "
     r"0\.\.1 without duplicates", 13),
    ("rank-gap", "rank: 1", "rank: 2",
     r"hosts\[1\]\.rank: group 'default' has 2 hosts, so ranks must be 0\.\.1; found 2", 13),
    ("duplicate-name", "- name: b", "- name: a",
     r"hosts\[1\]\.name: duplicate name 'a': already used by hosts\[0\]", 10),
    ("duplicate-address", "address: 127.0.0.22", "address: 127.0.0.21",
     r"hosts\[1\]\.address: duplicate address '127\.0\.0\.21'", 11),
    ("bad-ipv4", "address: 127.0.0.22", "address: 127.0.0.300",
     r"hosts\[1\]\.address: expected an IPv4 address.*found '127\.0\.0\.300'", 11),
    ("bad-hostname", "address: 127.0.0.22", "address: gb10_b!.lab",
     r"hosts\[1\]\.address: expected an IPv4 address, an IPv6 address \(without brackets\) or a host name",
     11),
    ("bracketed-ipv6", "address: 127.0.0.22", 'address: "[::1]"', r"hosts\[1\]\.address: .*found '\[::1\]'", 11),
    ("unknown-top-key", "lab: test-lab\n", "lab: test-lab\nowner: me\n",
     r":2: owner: unknown key; expected one of: baseline, builds, candidate", 2),
    ("misspelt-key", "    address: 127.0.0.22", "    adress: 127.0.0.22",
     r"hosts\[1\]\.adress: unknown key \(did you mean 'address'\?\)", 11),
    ("bad-policy", "host_key_policy: strict", "host_key_policy: lenient",
     r"ssh\.host_key_policy: expected 'strict' or 'accept-new', found 'lenient'", 4),
    ("jump-port", "port: 2222}", "port: 0}", r"ssh\.jump\.port: expected a value greater than or equal to 1", 5),
    ("kv-pages-both", "kv_pages: {metric: flare_kv_cache_pages}",
     "kv_pages: {metric: flare_kv_cache_pages, log_regex: 'pages (\\d+)'}",
     r"server\.kv_pages: expected exactly one of `metric` or `log_regex`, found both", 18),
    ("kv-pages-neither", "kv_pages: {metric: flare_kv_cache_pages}", "kv_pages: {}",
     r"server\.kv_pages: expected exactly one of `metric` or `log_regex`, found neither", 18),
    ("log-regex-no-group", "kv_pages: {metric: flare_kv_cache_pages}", "kv_pages: {log_regex: 'pages \\d+'}",
     r"server\.kv_pages\.log_regex: expected a regex with exactly one group, found 0", 18),
    ("unknown-placeholder", "--port {port}", "--port {prot}",
     r"server\.command: unknown placeholder \{prot\}; known placeholders: \{build_path\}", 16),
    ("unbalanced-quote", "--rank {rank}", "--rank '{rank}",
     r"server\.command: expected a command line shlex can split", 16),
    ("group-unknown-host", "server:\n", "groups:\n  - {name: g1, hosts: [a, c]}\nserver:\n",
     r"groups\[0\]\.hosts\[1\]: unknown host 'c'; known hosts: a, b", 15),
    ("host-in-two-groups", "server:\n",
     "groups:\n  - {name: g1, hosts: [a]}\n  - {name: g2, hosts: [a, b]}\nserver:\n",
     r"groups\[1\]\.hosts\[0\]: host 'a' is already in group 'g1'", 16),
    ("group-ranks", "server:\n", "groups:\n  - {name: g1, hosts: [b]}\nserver:\n",
     r"hosts\[1\]\.rank: group 'g1' has 1 host, so ranks must be 0\.\.0; found 1", 13),
    ("empty-hosts", BASE[BASE.index("hosts:"):BASE.index("server:")], "hosts: []\n",
     r"hosts: expected at least 1 item, found none", 6),
    ("flags-not-a-list", 'flags: [--x, "1"]', "flags: --x",
     r"builds\.set4\.flags: expected a list, found '--x'", 20),
    ("build-without-path", "two_choice: {path: /opt/b/tc/server, ref: abc123}", "two_choice: {ref: abc123}",
     r"builds\.two_choice: expected exactly one source of `path`, `artifact` or `image`, found none", 21),
    ("unknown-metric-name", "builds:\n", "metrics: {hit: x}\nbuilds:\n",
     r"metrics\.hit: unknown key \(did you mean 'hits'\?\)", 19),
    ("bad-metric-name", "builds:\n", "metrics: {hits: 'row cache hits'}\nbuilds:\n",
     r"metrics\.hits: expected a Prometheus name", 19),
    ("duplicate-key", "candidate: two_choice\n", "candidate: two_choice\nbaseline: two_choice\n",
     r":24: baseline: duplicate key 'baseline' \(first given on line 22\)", 24),
    ("yaml-syntax", "    rank: 0\n", "    rank: [0\n",
     r"hosts\.yaml:10: YAML syntax error: while parsing a flow sequence \(started on line 9\): "
     r"expected ',' or '\]', but got ':'", 10),
    ("not-a-mapping", BASE, "- just\n- a list\n",
     r"hosts\.yaml:1: expected a mapping of keys at the top level, found a list", 1),
    ("empty-file", BASE, "",
     r"hosts\.yaml:1: expected a mapping of keys at the top level, found an empty file", 1),
    ("timeout-zero", "  user: qualify\n", "  user: qualify\n  connect_timeout_s: 0\n",
     r"ssh\.connect_timeout_s: expected a value greater than 0", 4),
    ("declared-unknown-parameter", "ref: abc123}", "ref: abc123, cache: {polcy: two_choice}}",
     r"builds\.two_choice\.cache\.polcy: the flare-rowcache emulator of runtime flare has no parameter 'polcy' "
     r"\(did you mean 'policy'\?\); expected one of policy, cache_size, ranks, prefill_chunk", 21),
    ("declared-not-a-value", "ref: abc123}", "ref: abc123, cache: {policy: [two_choice]}}",
     r"builds\.two_choice\.cache\.policy: expected a number, true/false or a word \(an emulator parameter's "
     r"value\), found \['two_choice'\]$", 21),
    ("emulator-places-not-a-place", "builds:\n", "emulator: {parameters: {policy: [{flag: sim-policy}]}}\nbuilds:\n",
     r"emulator\.parameters\.policy\[0\]\.flag: ", 19),
]


@pytest.mark.parametrize(("old", "new", "match", "line"),
                         [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_malformed_inventory(tmp_path: Path, old: str, new: str, match: str, line: int | None) -> None:
    text = edit(old, new) if old != BASE else new
    with pytest.raises(InventoryError, match=match) as info:
        load_inventory(write(tmp_path, text))
    message = str(info.value)
    assert "\n" not in message, "errors are one line"
    assert message.startswith(str(tmp_path / "hosts.yaml"))
    assert info.value.line == line


def test_malformed_cases_are_many_and_distinct() -> None:
    assert len(MALFORMED) >= 15
    assert len({case[0] for case in MALFORMED}) == len(MALFORMED)


def test_yaml_syntax_error_names_its_line(tmp_path: Path) -> None:
    text = edit("    rank: 0\n", "    rank: 0\n   bad indentation: here\n")
    with pytest.raises(InventoryError, match=r"hosts\.yaml:10: YAML syntax error") as info:
        load_inventory(write(tmp_path, text))
    assert info.value.line == 10


@pytest.mark.parametrize("path", [REPO / "hosts.yaml", REPO / "examples" / "gb10-lab.yaml",
                                  *sorted(SCENARIO_DIR.glob("*.yaml"))], ids=lambda p: p.name)
def test_libyaml_and_the_pure_python_parser_read_the_same_data_and_lines(path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Files are read by libyaml where PyYAML has it; the pure-Python parser (PyYAML without it, and
    every file libyaml rejects, for its messages) must read them alike, value for value and line for line."""
    assert yamlsource._FAST_LOADER is not None, "PyYAML here is built without libyaml: the fast path goes untested"
    fast = load_yaml(path, error_type=InventoryError)
    monkeypatch.setattr(yamlsource, "_FAST_LOADER", None)
    plain = load_yaml(path, error_type=InventoryError)
    assert fast.data == plain.data and dict(fast.lines) == dict(plain.lines) and len(fast.lines) > 10


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match=r"nowhere\.yaml: file not found"):
        load_inventory(tmp_path / "nowhere.yaml")


# --- overrides, groups, hashes ----------------------------------------------------------------

def test_baseline_candidate_overrides(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    inventory = load_inventory(path, baseline="two_choice", candidate="two_choice")  # an A/A run
    assert (inventory.baseline, inventory.candidate) == ("two_choice", "two_choice")
    assert inventory.source == path.absolute()
    with pytest.raises(InventoryError, match=r"--candidate: unknown build 'lru4'; known builds: set4, two_choice"):
        load_inventory(path, candidate="lru4")


def test_candidate_list_in_the_file_and_on_the_command_line(tmp_path: Path) -> None:
    text = edit("candidate: two_choice\n", "candidate: [two_choice, lru4]\n").replace(
        "  two_choice: {path: /opt/b/tc/server, ref: abc123}\n",
        "  two_choice: {path: /opt/b/tc/server, ref: abc123, cost: a second set probe on a miss}\n"
        "  lru4: {path: /opt/b/lru4/server}\n")
    path = write(tmp_path, text)
    inventory = load_inventory(path)
    assert inventory.candidates == ("two_choice", "lru4")
    assert inventory.builds["two_choice"].cost == "a second set probe on a miss"
    assert load_inventory(path, candidate="lru4,set4").candidates == ("lru4", "set4")
    assert load_inventory(write(tmp_path, BASE, "one.yaml")).candidates == ("two_choice",)
    with pytest.raises(InventoryError, match=r"--candidate: build 'lru4' is named twice; each candidate runs once"):
        load_inventory(path, candidate="lru4,two_choice,lru4")
    with pytest.raises(InventoryError, match=r"--candidate: unknown build 'set8' \(did you mean 'set4'\?\); known builds: lru4, set4"):
        load_inventory(path, candidate="lru4,set8")
    written = write(tmp_path, text.replace("candidate: [two_choice, lru4]", "candidate: [lru4, set4]"), "w.yaml")
    assert load_inventory(path, candidate="lru4,set4").model_dump() == load_inventory(written).model_dump()
    twice = write(tmp_path, text.replace("candidate: [two_choice, lru4]", "candidate: [lru4, lru4]"), "twice.yaml")
    with pytest.raises(InventoryError, match=r"twice.yaml:24: candidate\[1\]: build 'lru4' is named twice"):
        load_inventory(twice)
    unknown = write(tmp_path, text.replace("candidate: [two_choice, lru4]", "candidate: [lru4, set16]"), "u.yaml")
    with pytest.raises(InventoryError, match=r"candidate\[1\]: unknown build 'set16'"):
        load_inventory(unknown)


def test_groups_resolved_declared_then_implicit(tmp_path: Path) -> None:
    hosts = "".join(f"  - {{name: h{i}, address: 10.0.0.{i}, rank: {r}}}\n"
                    for i, r in enumerate([1, 0, 1, 0, 0]))
    groups = "groups:\n  - {name: left, hosts: [h0, h1]}\n  - {name: right, hosts: [h2, h3]}\n"
    text = BASE[: BASE.index("hosts:")] + "hosts:\n" + hosts + groups + BASE[BASE.index("server:"):]
    resolved = load_inventory(write(tmp_path, text)).groups_resolved()
    assert [(g.name, [h.name for h in g.hosts]) for g in resolved] == [
        ("left", ["h1", "h0"]), ("right", ["h3", "h2"]), ("default", ["h4"])]
    assert resolved[0].rank0.name == "h1" and resolved[0].world_size == 2


def test_reserved_group_name(tmp_path: Path) -> None:
    text = edit("server:\n", "groups:\n  - {name: default, hosts: [a]}\nserver:\n").replace("rank: 1", "rank: 0")
    with pytest.raises(InventoryError, match=r"groups\[0\]\.name: group name 'default' is reserved"):
        load_inventory(write(tmp_path, text))


def test_metrics_renames_written_before_measurements_still_load(tmp_path: Path) -> None:
    text = edit("builds:\n", "metrics: {hits: rc_hits_total, refused_inserts: rc_refused_total}\nbuilds:\n")
    model = load_inventory(write(tmp_path, text)).measurement
    assert model.quantities["hits"].spec.counter == "rc_hits_total"
    assert model.quantities["refused_exported"].spec.counter == "rc_refused_total"
    assert model.quantities["hits"].unit == "rows" and model.quantities["misses"].spec.counter == (
        "flare_engram_row_cache_misses_total")
    text = edit("builds:\n", "metrics: {kv_pages: other_pages}\nbuilds:\n")
    with pytest.raises(InventoryError, match=r"metrics\.kv_pages: expected the same name as "
                       r"server\.kv_pages\.metric \('flare_kv_cache_pages'\), found 'other_pages'"):
        load_inventory(write(tmp_path, text))
    text = edit("builds:\n", "metrics: {hits: rc_hits_total}\nmeasurements: {hits: {counter: x_total}}\nbuilds:\n")
    with pytest.raises(InventoryError, match=r"measurements\.hits: hits is also given under `metrics`; give it "
                                             r"once, under `measurements:`"):
        load_inventory(write(tmp_path, text))


def test_ssh_options_value_object(tmp_path: Path) -> None:
    from cache_qualify.lab.transport.ssh import SshOptions

    options = SshOptions.from_settings(load_inventory(write(tmp_path, BASE)).ssh)
    assert isinstance(options, SshOptions)
    assert options.user == "qualify" and options.host_key_policy == "strict"
    assert options.known_hosts == ("~/.ssh/known_hosts",)
    assert options.jump is not None and (options.jump.address, options.jump.port) == ("bastion.example.com", 2222)


def test_inventory_hash_is_sha256_of_bytes(tmp_path: Path) -> None:
    path = write(tmp_path, BASE)
    assert inventory_hash(path) == hashlib.sha256(BASE.encode()).hexdigest()
    before = inventory_hash(path)
    path.write_text(BASE + "\n", encoding="utf-8")
    assert inventory_hash(path) != before


@pytest.mark.parametrize("address", ["127.0.0.11", "::1", "fe80::1", "gb10-a", "gb10-a.lab.example.com."])
def test_good_addresses(address: str) -> None:
    assert check_address(address) == address


@pytest.mark.parametrize("address", ["", "-gb10", "gb10-", "1.2.3", "256.1.1.1", "a..b", "a b", "[::1]",
                                     "x" * 64])
def test_bad_addresses(address: str) -> None:
    with pytest.raises(ValueError, match="expected an IPv4 address"):
        check_address(address)


# --- command rendering ------------------------------------------------------------------------

def test_render_expands_lists_and_substitutes_inside_tokens() -> None:
    argv = render_argv("{python} -m srv --port={port} 'two words' {flags}",
                       {"python": "/usr/bin/python3", "port": 8000, "flags": ["--a", "b c"]})
    assert argv == ["/usr/bin/python3", "-m", "srv", "--port=8000", "two words", "--a", "b c"]
    assert render_command("echo {flags}", {"flags": []}) == "echo"


def test_render_errors() -> None:
    with pytest.raises(InventoryError, match=r"server\.command: unknown placeholder \{host\}"):
        render_command("srv {host}", {"host": "x"})
    with pytest.raises(InventoryError, match=r"no value given for placeholder \{rank\}"):
        render_command("srv {rank}", {})
    with pytest.raises(InventoryError, match=r"placeholder \{flags\} holds several arguments and must stand alone"):
        render_command("srv --f={flags}", {"flags": ["a", "b"]})


HOSTILE = ["x; touch INJECTED", "$(touch INJECTED)", "`touch INJECTED`", "it's \"quoted\"",
           "line\ntouch INJECTED", "a && touch INJECTED", "> INJECTED", "*", "$HOME", "\\", ""]


def test_shell_metacharacters_in_inventory_values_are_not_interpreted(tmp_path: Path) -> None:
    """Build path and flags full of shell syntax reach the program literally through /bin/sh."""
    flags = json.dumps(HOSTILE[1:])  # JSON is YAML: every string arrives as written
    text = edit("  command: \"{build_path} --rank {rank} --port {port} {flags}\"",
                "  command: '{python} -c \"import json,sys; print(json.dumps(sys.argv[1:]))\" "
                "{build_path} {rank} {flags}'")
    text = text.replace('{path: /opt/b/set4/server, flags: [--x, "1"], description: the baseline}',
                        "{path: " + json.dumps(HOSTILE[0]) + ", flags: " + flags + "}")
    inventory = load_inventory(write(tmp_path, text))
    build = inventory.build("set4")
    command = render_command(inventory.server.command, {
        "python": sys.executable, "build_path": build.path, "rank": 0, "flags": list(build.flags)})
    result = subprocess.run(["/bin/sh", "-c", command], cwd=tmp_path, capture_output=True, text=True,
                            timeout=30, check=True)
    assert json.loads(result.stdout) == [HOSTILE[0], "0", *HOSTILE[1:]]
    assert not (tmp_path / "INJECTED").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hosts.yaml"]


# --- committed inventories and the schema ------------------------------------------------------

SIM_BUILDS = {"set4", "two_choice", "set8", "set16", "lru4", "set4-fat-cache", "set4-default-reserve",
              "rank1-exits", "crash-request3", "hang", "broken-metrics", "metrics-500", "prefix-reuse",
              "refused-metric"}


def test_committed_hosts_yaml_is_the_simulated_lab() -> None:
    inventory = load_inventory(REPO / "hosts.yaml")
    assert inventory.lab == "simulated-gb10"
    (group,) = inventory.groups_resolved()
    assert [(h.name, h.address, h.rank, h.transport) for h in group.hosts] == [
        ("gb10-a", "127.0.0.11", 0, "local"), ("gb10-b", "127.0.0.12", 1, "local"),
        ("gb10-c", "127.0.0.13", 2, "local")]
    assert (inventory.baseline, inventory.candidate) == ("set4", "two_choice")
    assert SIM_BUILDS <= set(inventory.builds)
    for name, build in inventory.builds.items():
        assert build.description, name
        share = build.flags[build.flags.index("--host-system-share") + 1]
        assert share == ("20" if name == "set4-default-reserve" else "40"), name
    fat = inventory.build("set4-fat-cache").flags
    assert fat[fat.index("--sim-extra-cache-share") + 1] == "0.25"
    assert inventory.server.kv_pages.metric == "flare_kv_cache_pages"
    # the command runs the emulated server from this checkout
    assert inventory.host_path(inventory.server.workdir or ".", group.rank0) == str(REPO)
    assert Path(inventory.host_path(inventory.build("set4").path, group.rank0)).is_file()


def test_committed_builds_are_accepted_by_the_emulated_server() -> None:
    """Every build's flags, with every shipped scenario's, parse with the emulated server's own parser."""
    from cache_qualify.config.scenario import available_scenarios, find_scenario, load_scenario
    from cache_qualify.sim.server import parse_args

    committed = load_inventory(REPO / "hosts.yaml")
    assert committed.server.http_port == 0
    inventory = committed.with_port(18080)   # as a host group picks one when it is opened
    (group,) = inventory.groups_resolved()
    for scenario_name in available_scenarios():
        scenario = load_scenario(find_scenario(scenario_name))
        for build in inventory.builds.values():
            for host in group.hosts:
                argv = render_argv(inventory.server.command, {
                    "python": sys.executable, "build_path": build.path, "rank": host.rank,
                    "world_size": group.world_size, "rank0_address": group.rank0.address,
                    "address": host.address, "port": inventory.server.http_port,
                    "flags": [*build.flags, *scenario.server_flags], "seed": 4_294_967_295})
                assert argv[:3] == [sys.executable, "-m", "cache_qualify.sim.server"]
                parsed = parse_args(argv[3:])
                assert (parsed.rank, parsed.host, parsed.sim_seed) == (host.rank, host.address, 4_294_967_295)
                assert parsed.rank0_address == f"127.0.0.11:{inventory.server.http_port}"


def test_committed_drop_caches_runs_unprivileged() -> None:
    inventory = load_inventory(REPO / "hosts.yaml")
    result = subprocess.run(["/bin/sh", "-c", inventory.server.drop_caches], capture_output=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr


def test_example_gb10_lab_loads() -> None:
    inventory = load_inventory(REPO / "examples" / "gb10-lab.yaml")
    assert {h.transport for h in inventory.hosts} == {"ssh"}
    assert inventory.ssh.jump is not None and inventory.ssh.host_key_policy == "strict"
    assert inventory.server.kv_pages.log_regex is not None
    assert re.search(inventory.server.kv_pages.log_regex, "KV cache: 41358 pages of 128 tokens")
    assert inventory.server.drop_caches.startswith("sync && echo 3 | sudo -n tee /proc/sys/vm/drop_caches")
    assert inventory.baseline in inventory.builds and inventory.candidate in inventory.builds
    # behind the jump host every rank's HTTP goes over its host's SSH connection, to the host's own address
    for host in inventory.hosts:
        where = inventory.addresses(host)
        assert (where.http_route, where.listen, where.behind_jump) == ("ssh", host.address, True)


def test_example_and_readme_describe_the_http_route() -> None:
    example = (REPO / "examples" / "gb10-lab.yaml").read_text(encoding="utf-8")
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Pointing the suite at a real lab", 1)[1].split("\n## ", 1)[0]
    for text in (example, section):
        for words in ("listen_address", "http_route", "forwarded over", "direct", "AllowTcpForwarding"
                      if text is example else "TCP forwarding"):
            assert words in text, words
    # the example's commented alternatives for a host are valid hosts too
    alternatives = re.findall(r"^#   (- \{name: gb10-a, .*\})$", example, re.M)
    assert len(alternatives) == 2
    for line in alternatives:
        assert Host.model_validate(yaml.safe_load(line)[0]).name == "gb10-a"


@pytest.mark.parametrize(("kind", "file"), [("inventory", "inventory.schema.json"),
                                            ("scenario", "scenario.schema.json")])
def test_committed_schema_is_current(kind: str, file: str) -> None:
    args = ["schema"] + (["--scenario"] if kind == "scenario" else [])
    done = run_cli(*args, timeout_s=60)
    assert done.returncode == 0, done.stderr
    printed = done.stdout
    committed = json.loads((REPO / "fixtures" / "cache_qualify" / "config" / "schema" / file).read_text(encoding="utf-8"))
    assert json.loads(printed) == committed == json_schema(kind)  # type: ignore[arg-type]


def test_schema_command_writes_a_file(tmp_path: Path) -> None:
    from cache_qualify.cli import main

    assert main(["schema", "--scenario", "-o", str(tmp_path / "s.json")]) == 0
    assert json.loads((tmp_path / "s.json").read_text(encoding="utf-8")) == json_schema("scenario")


def test_schema_command_names_a_file_it_cannot_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from cache_qualify.cli import main

    (tmp_path / "a-file").write_text("", encoding="utf-8")
    out = tmp_path / "a-file" / "s.json"
    assert main(["schema", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"cache-qualify: error: --output {out}: cannot write it: ") and len(err.splitlines()) == 1
    # a folder that does not exist is said, not made (a misspelt path would leave folders about)
    elsewhere = tmp_path / "no" / "such" / "s.json"
    assert main(["schema", "-o", str(elsewhere)]) == 2
    assert capsys.readouterr().err.strip() == (f"cache-qualify: error: --output {elsewhere}: cannot write it: the "
                                               f"folder {elsewhere.parent} does not exist (make it first, or name "
                                               f"a file in a folder that does)")
    assert not (tmp_path / "no").exists()


def test_schema_accepts_committed_and_rejects_unknown_keys() -> None:
    schema = json_schema("inventory")
    for path in (REPO / "hosts.yaml", REPO / "examples" / "gb10-lab.yaml"):
        jsonschema.validate(yaml.safe_load(path.read_text(encoding="utf-8")), schema)
    data = yaml.safe_load(BASE)
    data["hosts"][0]["adress"] = "x"
    with pytest.raises(jsonschema.ValidationError, match="adress"):
        jsonschema.validate(data, schema)


def test_the_schema_takes_a_fraction_s_part_as_one_name_or_several_as_the_loader_does(tmp_path: Path) -> None:
    schema = json_schema("inventory")
    for part in ("hits", ["hits", "external_hits"]):
        data = yaml.safe_load(BASE)
        data["measurements"] = {"hit_rate": {"fraction": {"part": part, "whole": ["prompt_tokens"]}}}
        jsonschema.validate(data, schema)
    data["measurements"]["hit_rate"]["fraction"]["part"] = []
    with pytest.raises(jsonschema.ValidationError, match=r"\[\] should be non-empty"):
        jsonschema.validate(data, schema)


def test_inventory_is_frozen(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, BASE))
    with pytest.raises(Exception, match="frozen"):
        inventory.lab = "other"
    assert isinstance(inventory, Inventory)


# --- the address model: SSH target, listen address, HTTP route -------------------------------------

ALIASES = """\
Host labb
  HostName 127.0.0.22
  Port 2222
  User lab
  ProxyJump bastion
Host labc
  HostName 127.0.0.23
"""


def alias_inventory(tmp_path: Path, ssh: str = "", b: str = "", c: str = "") -> Inventory:
    config = write(tmp_path, ALIASES, "ssh_config")
    text = edit("  jump: {address: bastion.example.com, port: 2222}\n", f"  ssh_config: {config}\n{ssh}")
    text = edited(text, "    address: 127.0.0.22\n    port: 2022\n", f"    address: labb\n{b}")
    text = edited(text, "    address: 127.0.0.21\n", f"    address: labc\n{c}")
    return load_inventory(write(tmp_path, text))


def test_an_alias_listens_on_its_hostname_and_a_proxy_jump_sends_http_over_ssh(tmp_path: Path) -> None:
    inventory = alias_inventory(tmp_path)
    a, b = inventory.hosts
    behind, direct = inventory.addresses(b), inventory.addresses(a)
    assert (behind.ssh_target, behind.listen, behind.http_route, behind.behind_jump) == (
        "labb", "127.0.0.22", "ssh", True)
    assert (direct.ssh_target, direct.listen, direct.http_route, direct.behind_jump) == (
        "labc", "127.0.0.23", "direct", False)


def test_explicit_listen_address_and_route_win(tmp_path: Path) -> None:
    inventory = alias_inventory(tmp_path, b="    listen_address: 10.0.0.2\n    http_route: direct\n",
                                c="    http_route: ssh\n")
    a, b = inventory.hosts
    assert (inventory.addresses(b).listen, inventory.addresses(b).http_route) == ("10.0.0.2", "direct")
    assert inventory.addresses(a).http_route == "ssh"


def test_every_host_behind_the_inventory_jump_host_defaults_to_the_ssh_route(tmp_path: Path) -> None:
    inventory = load_inventory(write(tmp_path, BASE))
    for host in inventory.hosts:
        where = inventory.addresses(host)
        assert (where.listen, where.http_route, where.behind_jump) == (host.address, "ssh", True)


def test_the_ssh_route_needs_the_ssh_transport(tmp_path: Path) -> None:
    text = edit("    address: 127.0.0.21\n", "    address: 127.0.0.21\n    transport: local\n    http_route: ssh\n")
    with pytest.raises(InventoryError, match=r"hosts.yaml:10: hosts\[0\]\.http_route: the `ssh` route forwards a "
                                             r"port over the host's SSH connection, but host 'a' uses the local "
                                             r"transport; use `direct`"):
        load_inventory(write(tmp_path, text))


def test_ranks_bind_and_meet_at_listen_addresses(tmp_path: Path) -> None:
    from cache_qualify.lab.control import Lab
    from cache_qualify.lab.server import ServerGroup

    inventory = alias_inventory(tmp_path)
    group = inventory.groups_resolved()[0]
    server = ServerGroup(Lab(inventory, group, run_id="r"), "set4", inventory.build("set4"))
    argv = shlex.split(server.command(group.hosts[1]))
    assert argv == ["/opt/b/set4/server", "--rank", "1", "--port", "18000", "--x", "1"]
    with_addresses = inventory.server.model_copy(update={"command": "{build_path} {address} {rank0_address}"})
    lab = Lab(inventory.model_copy(update={"server": with_addresses}), group, run_id="r")
    assert shlex.split(ServerGroup(lab, "set4", inventory.build("set4")).command(group.hosts[1]))[1:] == [
        "127.0.0.22", "127.0.0.23"]


def test_a_missing_default_ssh_config_is_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    inventory = load_inventory(write(tmp_path, edit("  user: qualify\n", "  user: qualify\n  ssh_config: ~/.ssh/config\n")))
    assert inventory.addresses(inventory.hosts[0]).listen == "127.0.0.21"


@pytest.mark.slow
def test_a_missing_named_ssh_config_is_one_line_at_load(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "ssh_config"
    path = write(tmp_path, edit("  user: qualify\n", f"  user: qualify\n  ssh_config: {missing}\n"))
    with pytest.raises(InventoryError, match=rf"^{re.escape(str(path))}:4: ssh\.ssh_config: the ssh config file "
                                             rf"{re.escape(str(missing))} does not exist \(only the default "
                                             rf"~/.ssh/config may be missing\); create it or remove `ssh_config`$"):
        load_inventory(path)
    run = subprocess.run([sys.executable, "-m", "pytest", "qualify", "--hosts", str(path), "-p", "no:cacheprovider",
                          "-q", "--preflight-only", "--reports-dir", str(tmp_path / "reports")],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 4, run.stdout + run.stderr
    assert (run.stdout + run.stderr).count(f"the ssh config file {missing} does not exist") == 1, run.stdout + run.stderr


def test_the_default_drop_needs_no_sudo_as_root_and_asks_sudo_n_otherwise() -> None:
    """Run for real: as root (the test session's user) it writes the file itself, so a host without
    sudo drops its caches; as another user it goes through `sudo -n` (here a stand-in sudo on PATH
    that records its arguments and refuses, as sudo does without a NOPASSWD line)."""
    import os
    import subprocess
    import tempfile

    from cache_qualify.config.inventory import DEFAULT_DROP_CACHES

    assert os.geteuid() == 0, "the suite's tests run as root"
    with tempfile.TemporaryDirectory(prefix="cq-sudo-") as folder:   # one another user can enter
        os.chmod(folder, 0o755)
        fake, calls = Path(folder) / "sudo", Path(folder) / "sudo-calls"
        fake.write_text(f"#!/bin/sh\nprintf '%s\\n' \"$*\" >> {calls}\necho 'sudo: a password is required' >&2\n"
                        "exit 1\n", encoding="utf-8")
        fake.chmod(0o755)
        calls.touch()
        calls.chmod(0o666)
        env = {"PATH": f"{folder}:/usr/bin:/bin"}
        as_root = subprocess.run(["sh", "-c", DEFAULT_DROP_CACHES], env=env, capture_output=True, text=True)
        assert as_root.returncode == 0, as_root.stderr
        assert calls.read_text(encoding="utf-8") == ""
        as_nobody = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "sh", "-c",
                                    DEFAULT_DROP_CACHES], env=env, capture_output=True, text=True)
        assert as_nobody.returncode != 0 and "a password is required" in as_nobody.stderr
        assert calls.read_text(encoding="utf-8") == "-n tee /proc/sys/vm/drop_caches\n"


def test_a_misspelt_build_on_the_command_line_gets_a_suggestion() -> None:
    with pytest.raises(InventoryError, match=r"--candidate: unknown build 'two_chioce' \(did you mean 'two_choice'\?\); "
                                             r"known builds: "):
        load_inventory(REPO / "hosts.yaml", candidate="two_chioce")


def test_a_key_misspelt_in_every_host_is_named_not_the_empty_list_it_leaves(tmp_path: Path) -> None:
    """Every host refused leaves `hosts` empty too; that echo comes after the misspelling itself."""
    text = BASE.replace("    address:", "    adress:")
    with pytest.raises(InventoryError, match=r"hosts\.yaml:8: hosts\[0\]\.adress: unknown key \(did you mean "
                                             r"'address'\?\); expected one of: .* \(and \d+ more problems\)$"):
        load_inventory(write(tmp_path, text))
