"""`image` builds run by a real engine: podman (with runc) on two simulated hosts of this machine, images
pushed by the tests to a real registry on loopback (Debian's docker-registry) and pulled by digest.

One registry and one image (a busybox root filesystem serving /health) are shared by the module's tests;
after each test the engine lists no container of the suite. Cost: about 30 s on two cores, and (slow) 55 s for
the real llama-server's qualification, 27 s for the simulated lab's with an image candidate and 45 s for a
runner killed while its containers run; 15 s for Ctrl-C during a pull.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from cache_qualify import cachedir
from cache_qualify.config.inventory import Inventory, load_inventory
from cache_qualify.errors import BuildError, CommandFailed, StaleServer
from cache_qualify.lab.control import Lab
from cache_qualify.lab.preflight import check_builds
from cache_qualify.lab.transport import LocalTransport
from cache_qualify.lab.server import ServerGroup
from cache_qualify.qualification.lab_session import record_digests, resolved_images
from cache_qualify.samples import runfolder
from cache_qualify.samples.records import BuildRecord, Plan
from tests.support import containers
from tests.support.examples import adapt_example, outcomes
from tests.support.labfaults import failures
from tests.support.labfixtures import (REPO, free_port, interrupt, run_qualify, small_scenario_option, start_qualify,
                                      write_file, write_inventory)
from tests.support.waiting import wait_for
from tests.support.llama_server import llama_server_binary
from tests.support.tiny_model import make_tiny_model

pytestmark = pytest.mark.containers

BUSYBOX = Path("/bin/busybox")
LLAMA_EXAMPLE, LLAMA_RESEND = REPO / "examples" / "llama-cpp.yaml", REPO / "examples" / "llama-cpp-resend.yaml"
LLAMA_BINARY, LLAMA_MODEL = "/opt/llama.cpp/build/bin/llama-server", "/srv/models/model.gguf"
# the rank prints a KV line (its rank as the page count) and serves the image's /www over HTTP
INVENTORY = """\
lab: containers
hosts:
  - {{name: a, address: 127.0.0.11, rank: 0, transport: local}}
  - {{name: b, address: 127.0.0.12, rank: 1, transport: local}}
server:
  runtime: flare
  command: >-
    {{build_path}} sh -c 'echo KV cache: $0 pages; exec /bin/busybox httpd -f -p $1 -h /www'
    {{rank}} {{address}}:{{port}}
  http_port: {port}
  run_dir: on-hosts
  stop_grace_s: 2
  readiness: {{path: /health, timeout_s: 60}}
  container:
    engine: podman
    engine_options: [--runtime, runc]
    run_options: [--ulimit, "nofile=1024:1024", --ulimit, "nproc=1024:1024"]
    program: /bin/busybox
builds:
  served: {{image: "{image}"}}
baseline: served
candidate: served
"""


@pytest.fixture(scope="module")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[containers.Registry]:
    try:
        yield from containers.start_registry(tmp_path_factory.mktemp("registry"))
    except containers.ContainersUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="module")
def image(registry: containers.Registry) -> tuple[str, str]:
    """(name:tag, digest) of a busybox image in the registry, not in the engine's store."""
    return registry.push_rootfs("cq-busybox", "t1", {"/bin/busybox": BUSYBOX, "/bin/sh": BUSYBOX,
                                                     "/www/health": b"ok\n"})


@pytest.fixture(autouse=True)
def no_container_left(tmp_path: Path) -> Iterator[None]:
    yield
    left = containers.remove_suite_containers(tmp_path)
    assert left == [], f"the engine still lists the suite's containers {left} after the test"


def inventory_of(tmp_path: Path, image: str) -> Inventory:
    text = INVENTORY.format(port=free_port(("127.0.0.11", "127.0.0.12")), image=image)
    return load_inventory(write_file(tmp_path, text, "hosts.yaml"))


def test_an_image_build_is_pulled_by_digest_runs_as_containers_and_stops_through_the_engine(
        tmp_path: Path, image: tuple[str, str]) -> None:
    reference, digest = image
    inventory = inventory_of(tmp_path, reference)
    with Lab(inventory, inventory.groups_resolved()[0], run_id="img-run") as lab:   # pulls on every host
        server = ServerGroup(lab, "served", inventory.build("served"), tag="t0")
        with server:
            server.start()
            assert server.identity is not None and f"sha256:{server.identity.digest}" == digest
            server.wait_ready()
            assert server.number_from_log(r"KV cache: (\d+) pages") == {"a": 0, "b": 1}
            listed = containers.podman("ps", "--filter", "label=cache-qualify.run=img-run", "--format",
                                       "{{.Names}} {{.Image}} {{.Labels}}").stdout.splitlines()
            assert len(listed) == 2 and all(f"@{digest}" in line or digest.removeprefix("sha256:")[:12] in line
                                            for line in listed), listed
            assert all("cache-qualify.build:served" in line for line in listed), listed
        # stopped through the engine: nothing of the run is listed any more
        assert containers.suite_containers(tmp_path) == []
        logs = server.fetch_logs(tmp_path / "logs")
        assert sorted(kept.text.splitlines()[0] for kept in logs) == ["KV cache: 0 pages", "KV cache: 1 pages"]
        assert all(kept.path.read_text(encoding="utf-8") == kept.text for kept in logs)


def test_a_tag_moved_after_the_run_resolved_it_never_reaches_a_start(tmp_path: Path,
                                                                      registry: containers.Registry) -> None:
    """The tag is pushed again, to another image, once the run resolved it: the run's starts still run the
    first digest, a later host group of the run takes it from the plan without resolving again, and a
    process of the run that resolved the moved tag by itself is refused before any start, naming both."""
    files: dict[str, Path | bytes] = {"/bin/busybox": BUSYBOX, "/bin/sh": BUSYBOX, "/www/health": b"ok\n"}
    reference, first = registry.push_rootfs("cq-moving", "pr", files)
    inventory = inventory_of(tmp_path, reference)
    group, run_dir = inventory.groups_resolved()[0], tmp_path / "run"
    runfolder.write_plan(run_dir, Plan(run_id="moved", seed=0, builds={
        "served": BuildRecord(build="served", role="baseline and candidate", path=reference, source="image")}))
    with Lab(inventory, group, run_id="moved", images=resolved_images(run_dir)) as lab:
        record_digests(run_dir, lab)
        _, second = registry.push_rootfs("cq-moving", "pr", {**files, "/www/health": b"moved\n"})
        assert second != first
        with ServerGroup(lab, "served", inventory.build("served"), tag="t0") as server:
            server.start()
            server.wait_ready()
            images = containers.podman("ps", "--filter", "label=cache-qualify.run=moved", "--format",
                                       "{{.Image}}").stdout.split()
            assert len(images) == 2 and all(i.endswith(f"@{first}") for i in images), (images, first)
    with Lab(inventory, group, run_id="moved", images=resolved_images(run_dir)) as later:
        assert f"sha256:{later.builds.identities['served'].digest}" == first
    with Lab(inventory, group, run_id="moved") as racing, pytest.raises(BuildError, match=(
            rf"^host a: build 'served': {re.escape(reference)} resolved to {second} here, but to {first} earlier in "
            rf"this run \(its tag moved\): pin {re.escape(reference.rsplit(':', 1)[0])}@sha256:\.\.\. and run again$")):
        record_digests(run_dir, racing)


def test_the_lock_holder_stops_the_containers_of_a_runner_that_left_them(tmp_path: Path,
                                                                           image: tuple[str, str]) -> None:
    """A runner gone without stopping its ranks (its lab closed, as its lock holder sees a dead runner):
    the release command stops the containers it recorded."""
    inventory = inventory_of(tmp_path, image[0])
    lab = Lab(inventory, inventory.groups_resolved()[0], run_id="left").open()
    server = ServerGroup(lab, "served", inventory.build("served"), tag="t0")
    server.start()
    server.wait_ready()
    assert len(containers.suite_containers(tmp_path)) == 2
    lab.close()
    assert containers.suite_containers(tmp_path) == []
    server.close()


def test_a_stale_container_is_named_and_kill_stale_removes_it(tmp_path: Path, image: tuple[str, str]) -> None:
    inventory = inventory_of(tmp_path, image[0])
    with Lab(inventory, inventory.groups_resolved()[0], run_id="next") as lab:
        folder = lab.dir(inventory.hosts[1])
        # what an earlier run left on host b: a container with its labels, its records gone with it
        containers.podman("run", "-d", "--name", "cq-earlier-b", "--label", "cache-qualify.run=earlier",
                          "--label", f"cache-qualify.dir={folder}", *containers.RUN_OPTIONS,
                          f"{image[0].rsplit(':', 1)[0]}@{image[1]}", "/bin/busybox", "sleep", "600")
        server = ServerGroup(lab, "served", inventory.build("served"))
        with pytest.raises(StaleServer, match=r"^host b rank 1: containers from an earlier run are still there "
                                              r"\(cq-earlier-b of run earlier\); stop them or rerun with --kill-stale$"):
            server.check_stale(kill=False)
        server.check_stale(kill=True)
        assert containers.suite_containers(tmp_path) == []
        server.close()


@pytest.mark.parametrize(("where", "match"), [
    ("missing", r"^host a: build 'served': pulling 127\.0\.0\.1:\d+/cq-nothing:t1 failed \(status \d+\): .*manifest "
                r"unknown"),
    ("refused", r"^host a: build 'served': pulling 127\.0\.0\.1:\d+/cq-busybox:t1 failed \(status \d+\): .*"
                r"connection refused"),
])
def test_an_image_that_cannot_be_pulled_fails_before_any_start_in_one_line(
        tmp_path: Path, registry: containers.Registry, image: tuple[str, str], where: str, match: str) -> None:
    reference = (image[0].replace("cq-busybox", "cq-nothing") if where == "missing"
                 else image[0].replace(registry.address, f"127.0.0.1:{free_port(('127.0.0.1',))}"))
    inventory = inventory_of(tmp_path, reference)
    with pytest.raises(BuildError, match=match) as info:
        Lab(inventory, inventory.groups_resolved()[0], run_id="nope").open()
    assert "\n" not in str(info.value)


@pytest.mark.slow
@pytest.mark.xdist_group("llama-qualify")   # one real-server qualification at a time on two cores
def test_the_real_llama_server_in_an_image_pulled_by_digest_qualifies_its_host_memory_cache(
        tmp_path: Path, registry: containers.Registry) -> None:
    """examples/llama-cpp.yaml with its builds the llama-server image (the binary the tests build and the
    libraries it links, in a root filesystem) in the loopback registry: the baseline pinned by digest, the
    candidate given on the command line by its tag; --cache-ram 8192 against --cache-ram 0 on exact re-sends,
    decided; the model mounted read-only, the page-cache drop on the host. Cost: about 55 s."""
    (tmp_path / "model").mkdir()
    binary, model = llama_server_binary(), make_tiny_model(tmp_path / "model")
    tagged, digest = registry.push_rootfs("cq-llama", "t1", containers.program_files(binary, "/llama-server"))
    pinned = f"{registry.address}/cq-llama@{digest}"
    path = adapt_example(LLAMA_EXAMPLE, tmp_path, program=(LLAMA_BINARY, binary), model=(LLAMA_MODEL, model.path),
                         command_suffix=" -t 1")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    data["server"]["container"] = {"engine": "podman", "engine_options": list(containers.ENGINE_OPTIONS),
                                   "run_options": [*containers.RUN_OPTIONS, "-v", f"{model.path}:{model.path}:ro"],
                                   "program": "/llama-server"}
    for build in data["builds"].values():
        del build["path"]
        build["image"] = pinned
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    # the candidate given whole on the command line, by its tag: resolved to the digest once, then pinned
    run = run_qualify(path, tmp_path / "reports", "--scenario", str(LLAMA_RESEND), "--max-trials", "16",
                      "--candidate", f"cache-8g=ram-cache@image:{tagged}", timeout_s=600)
    assert run.returncode == 0, run.output[-6000:]
    seen = outcomes(run)
    assert seen["test_prompt_cache[hit_rate-gain[A-again]]"] == "passed", run.output[-4000:]
    provenance = json.loads((run.run_dir() / "provenance.json").read_text(encoding="utf-8"))
    assert {name: (b["source"], b["digest"], b["path"]) for name, b in provenance["builds"].items()} == {
        "no-ram-cache": ("image", digest.removeprefix("sha256:"), pinned),
        "cache-8g": ("image", digest.removeprefix("sha256:"), tagged)}


def test_the_preflight_names_a_host_whose_engine_does_not_answer(tmp_path: Path, image: tuple[str, str]) -> None:
    inventory = inventory_of(tmp_path, image[0])
    host = inventory.hosts[0]
    check_builds(inventory, host, LocalTransport(host.name))   # podman answers
    absent = inventory.model_copy(update={"server": inventory.server.model_copy(update={
        "container": inventory.server.container.model_copy(update={"engine": "docker", "engine_options": ()})})})
    # no docker here: its client missing (status 127) or without a daemon (Cannot connect ...)
    with pytest.raises(CommandFailed, match=r"^host a: the container engine `docker` \(server\.container\) does not "
                                            r"answer there: (.*not found \(status 127\)|Cannot connect.*\(status 1\))$"):
        check_builds(absent, host, LocalTransport(host.name))


def simulated_lab_in_containers(tmp_path: Path) -> Path:
    """The committed simulated lab whose image builds' ranks run the runner's Python and this checkout
    through read-only volumes (the busybox image holds no Python), the suite's cache folder mounted for the
    emulated server's compiled kernels."""
    cache = str(cachedir.resolve().root)
    volumes = [w for folder in ("/usr", sys.base_prefix, sys.prefix, str(REPO)) for w in ("-v", f"{folder}:{folder}:ro")]
    run_options = [*containers.RUN_OPTIONS, *volumes, "-v", "/usr/lib:/lib:ro", "-v", "/usr/lib64:/lib64:ro",
                   "-v", f"{cache}:{cache}", "-e", f"CACHE_QUALIFY_CACHE_DIR={cache}"]
    return write_inventory(tmp_path, server={"container": {
        "engine": "podman", "engine_options": list(containers.ENGINE_OPTIONS), "run_options": run_options}})


def image_candidate_run(tmp_path: Path, reference: str, run_id: str) -> tuple[str, ...]:
    """A short qualification's options, its candidate `pr-image` the image `reference` given on the command line."""
    return (*small_scenario_option(tmp_path, "image-short"), "--trials", "2", "--max-trials", "2", "--seed", "5",
            "--run-id", run_id, "--candidate", f"pr-image=two_choice@image:{reference}")


@pytest.mark.slow
def test_the_simulated_lab_qualifies_a_candidate_given_as_an_image(tmp_path: Path, registry: containers.Registry,
                                                                    image: tuple[str, str]) -> None:
    """The committed simulated lab, its candidate given on the command line as the busybox image by tag: each
    candidate rank a container on the host's network, running the runner's Python and this checkout through
    read-only volumes the inventory's run_options give (the image holds no Python; its digest is what the
    arm records), the suite's cache folder mounted for the emulated server's compiled kernels. Qualified,
    exit 0, the image's digest recorded, no container of the run left. Cost: about 27 s."""
    reference, digest = image
    run_id = f"image-{uuid.uuid4().hex[:8]}"   # the engine's event log outlives the test: this run's alone
    run = run_qualify(simulated_lab_in_containers(tmp_path), tmp_path / "reports",
                      *image_candidate_run(tmp_path, reference, run_id), timeout_s=300)
    assert run.returncode == 0, run.output[-6000:]
    provenance = json.loads((run.run_dir() / "provenance.json").read_text(encoding="utf-8"))
    assert (provenance["builds"]["pr-image"]["source"], provenance["builds"]["pr-image"]["digest"]) == (
        "image", digest.removeprefix("sha256:"))
    # the candidate's ranks ran as the run's containers, on each of the three hosts
    events = containers.podman("events", "--stream=false", "--filter", "event=start", "--filter",
                               f"label=cache-qualify.run={run_id}", "--format",
                               '{{.Name}} {{index .Attributes "cache-qualify.build"}}').stdout.splitlines()
    assert events and {line.split()[1] for line in events} == {"pr-image"}, events
    assert {line.split()[0].split("-rank")[0][-6:] for line in events} == {"gb10-a", "gb10-b", "gb10-c"}, events


@pytest.mark.slow
def test_containers_of_a_killed_runner_whose_lock_holders_died_are_named_by_the_next_run_and_removed(
        tmp_path: Path, image: tuple[str, str]) -> None:
    """A real runner SIGKILLed while its candidate's containers run, its lock holders killed with it (so none
    stops them: a runner killed alone has them stopped by its holders, test_the_lock_holder_stops_...): the
    next run fails before any start naming the host, the container and its run; a run with --kill-stale
    removes them and qualifies. Cost: about 45 s."""
    inventory, reports = simulated_lab_in_containers(tmp_path), tmp_path / "reports"
    killed = start_qualify(inventory, reports, *image_candidate_run(tmp_path, image[0], "killed"))
    try:
        running = wait_for(lambda: containers.podman("ps", "--filter", "label=cache-qualify.run=killed", "--format",
                                                     "{{.Names}}").stdout.split(), 120,
                           "a container of the run running", process=killed)
        assert containers.kill_lock_holders(tmp_path / "on-hosts") == 3
        os.killpg(killed.pid, signal.SIGKILL)
    finally:
        if killed.poll() is None:
            os.killpg(killed.pid, signal.SIGKILL)
        killed.communicate(timeout=60)
    assert set(running) <= set(containers.suite_containers(tmp_path))   # they outlive their runner
    refused = run_qualify(inventory, reports, *image_candidate_run(tmp_path, image[0], "next"),
                          f"--junitxml={tmp_path / 'next.xml'}", timeout_s=300)
    assert refused.returncode != 0
    said = "\n".join(failures(refused).values())   # the preflight's port check, on each host holding one
    assert re.search(rf"StaleServer: host gb10-\w rank \d: port \d+ on [\d.]+ is in use and a server an earlier run "
                     rf"left is still running \(process group \d+, recorded in \S+; its containers: {running[0]} of "
                     rf"run killed\); stop it, or rerun with --kill-stale", said), said or refused.output[-4000:]
    cleaned = run_qualify(inventory, reports, *image_candidate_run(tmp_path, image[0], "cleaned"), "--kill-stale",
                          timeout_s=300)
    assert cleaned.returncode == 0, cleaned.output[-6000:]
    assert not any(name.startswith("cq-killed-") for name in containers.suite_containers(tmp_path))


def test_ctrl_c_during_a_pull_stops_it_in_one_line_leaving_nothing_running(tmp_path: Path) -> None:
    """A run whose candidate's image comes from a registry that stalls, interrupted (SIGINT, as Ctrl-C) while
    the engine pulls it: one line naming the host, the build and the cause, no pull and no container left.
    Cost: about 15 s."""
    with containers.stalled_registry() as address:
        reference = f"{address}/cq-stalled:pr"
        run = start_qualify(simulated_lab_in_containers(tmp_path), tmp_path / "reports",
                            *image_candidate_run(tmp_path, reference, "pulling"))
        try:
            wait_for(lambda: [line for line in containers.processes_naming(reference) if " pull " in line], 120,
                     "the engine pulling the candidate's image", process=run)
            output = interrupt(run)
        finally:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.communicate()
        assert (f"host gb10-a: build 'pr-image': pulling {reference} interrupted (Ctrl-C), the pull stopped"
                in output), output[-4000:]
        wait_for(lambda: not containers.processes_naming(reference), 10, "no process pulling the image left",
                 detail=lambda: "\n".join(containers.processes_naming(reference)))
