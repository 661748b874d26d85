"""The llama-slot emulator against the real llama-server, under the parameters the shipped runtime profile
reads (`emulator:` of llama-cpp.yaml) from the server's own command line and log: --cache-ram of a size
that holds one saved 5,000-token prompt of the tiny model (1 MiB: its state is 0.668 MiB) and of one that
holds two (2 MiB), so the prediction turns on the state size the log gives, not on the flag alone."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest

from cache_qualify.config.profiles import load_profile
from cache_qualify.emulation.model import Prompts
from cache_qualify.emulation.registry import predict
from cache_qualify.emulation.sources import BuildCache, StartFacts, read_build
from tests.support.llama_server import llama_server_binary, running_llama_server
from tests.support.tiny_model import TinyModel, make_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> TinyModel:
    return make_tiny_model(tmp_path_factory.mktemp("llama-model"))


@pytest.mark.parametrize(("cache_ram", "cached"), [("1", [0, 0, 0, 0]), ("2", [0, 0, 4_999, 4_999])])
def test_the_parameters_the_profile_reads_predict_what_the_real_server_serves(
        model: TinyModel, tmp_path: Path, cache_ram: str, cached: list[int]) -> None:
    rng = np.random.default_rng(30)
    a, b = ([int(t) for t in rng.integers(model.first_id, model.last_id + 1, 5_000)] for _ in range(2))
    flags = ["-np", "1", "-t", "1", "-lv", "4", "--cache-ram", cache_ram]
    binary = llama_server_binary()
    with running_llama_server(binary, model.path, tmp_path / "server.log", flags) as server, \
            httpx.Client(base_url=server.base_url, timeout=60) as client:
        measured = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 1}).json()
                    ["usage"]["prompt_tokens_details"]["cached_tokens"] for p in (a, b, a, b)]
    spec = load_profile("llama-cpp").emulator
    assert spec is not None
    cache = read_build("real", spec, StartFacts((str(binary), "-m", str(model.path), *flags), log=server.log()))
    assert isinstance(cache, BuildCache), cache
    # the state read from "saving prompt with length 5000, total state size = 0.668 MiB" (700,048 bytes)
    assert (cache.params["n_ctx"], cache.params["cache_ram_mib"], cache.params["state_bytes_per_token"]) == \
        (8_192, int(cache_ram), 140)
    predicted = predict(cache.emulator, cache.params, Prompts.of([a, b, a, b])).cached_tokens.tolist()
    assert predicted == measured == cached



# with no host cache (--cache-ram 0) only the slots hold the conversations: one slot would serve none of
# the continuations, two serve the first (a's, before c takes the other slot), four serve them all
SLOTS = [((), (4, True), "8192", [0, 0, 600, 0, 500, 900, 700, 900]),
         (("--parallel", "2"), (2, False), "8192", [0, 0, 600, 0, 500, 900, 700, 900]),
         ((), (4, True), "0", [0, 0, 600, 0, 500, 900, 700, 900]),
         (("--parallel", "2"), (2, False), "0", [0, 0, 600, 0, 0, 0, 0, 0])]


@pytest.mark.parametrize(("slots", "layout", "cache_ram", "served"), SLOTS,
                         ids=["auto-4-unified", "parallel-2", "auto-4-no-host-cache", "parallel-2-no-host-cache"])
def test_several_slots_serve_a_multi_conversation_slice_as_the_emulator_predicts(
        model: TinyModel, tmp_path: Path, slots: tuple[str, ...], layout: tuple[int, bool], cache_ram: str,
        served: list[int]) -> None:
    """Three conversations whose turns interleave (a, b, a longer, c, b longer, a longer again, c longer, b
    longer again), one request at a time, on llama-server's default 4 slots sharing one KV buffer (idle slots
    saved to the host cache and cleared at each new task) and on --parallel 2 (two slots of their own, idle
    ones saved and kept), with the default host cache and with none: the emulator, under the slots, kv_unified
    and context the start's log prints, predicts every request's cached tokens exactly (one request at a
    time, none waits for a slot, so the replay is exact; about a second a start)."""
    rng = np.random.default_rng(56)

    def turn(n: int) -> list[int]:
        return [int(t) for t in rng.integers(model.first_id, model.last_id + 1, n)]

    a, b, c = turn(600), turn(500), turn(700)
    a2, b2, c2 = a + turn(300), b + turn(400), c + turn(200)
    a3, b3 = a2 + turn(250), b2 + turn(150)
    prompts = [a, b, a2, c, b2, a3, c2, b3]
    flags = [*slots, "-t", "1", "-lv", "4", "--cache-ram", cache_ram]
    measured, cache = _served(model, tmp_path, flags, prompts)
    assert (cache.params["n_slots"], cache.params["kv_unified"]) == layout, cache
    predicted = predict(cache.emulator, cache.params, Prompts.of(prompts)).cached_tokens.tolist()
    assert predicted == measured == served, (predicted, measured, cache.params)


def test_the_host_cache_holds_the_servers_whole_context_as_the_emulator_predicts(
        model: TinyModel, tmp_path: Path) -> None:
    """--parallel 2 with -c 2048 (two slots of 1,024 cells, no unified buffer) and no size limit on the host
    cache (--cache-ram -1), three conversations then the first's continuation: the cache's token limit is the
    whole context, 2,048 tokens, as llama_context prints it at -lv 4, so the first conversation's saved prompt
    outlives the second's save and is restored (600 cached); a slot's 1,024 would have dropped it (0)."""
    rng = np.random.default_rng(57)
    a, b, c = ([int(t) for t in rng.integers(model.first_id, model.last_id + 1, 600)] for _ in range(3))
    prompts = [a, b, c, a + [int(t) for t in rng.integers(model.first_id, model.last_id + 1, 10)]]
    flags = ["--parallel", "2", "-c", "2048", "-t", "1", "-lv", "4", "--cache-ram", "-1"]
    measured, cache = _served(model, tmp_path, flags, prompts)
    assert (cache.params["n_ctx"], cache.params["n_slots"], cache.params["n_ctx_total"]) == (1_024, 2, 2_048)
    predicted = predict(cache.emulator, cache.params, Prompts.of(prompts)).cached_tokens.tolist()
    assert predicted == measured == [0, 0, 0, 600], (predicted, measured, cache.params)


def _served(model: TinyModel, tmp_path: Path, flags: list[str], prompts: list[list[int]]
            ) -> tuple[list[int], BuildCache]:
    """Each prompt's cached tokens as a real llama-server with `flags` served them, one request at a time, and
    the build's cache as the llama-cpp profile reads it from that start's command line and log."""
    binary = llama_server_binary()
    with running_llama_server(binary, model.path, tmp_path / "server.log", flags) as server, \
            httpx.Client(base_url=server.base_url, timeout=60) as client:
        measured = [client.post("/v1/completions", json={"prompt": p, "max_tokens": 1}).json()
                    ["usage"]["prompt_tokens_details"]["cached_tokens"] for p in prompts]
    spec = load_profile("llama-cpp").emulator
    assert spec is not None
    cache = read_build("real", spec, StartFacts((str(binary), "-m", str(model.path), *flags), log=server.log()))
    assert isinstance(cache, BuildCache), cache
    return measured, cache
