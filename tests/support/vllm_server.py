"""A real vLLM OpenAI server (its CPU build) on a free 127.0.0.x port, for tests, and its tiny model.

`vllm_python` installs or finds vLLM (`tests.support.vllm_build`) and FAILS the test, never skips
it, when it cannot be installed. `make_tiny_llama` has that environment's ``transformers`` save a
seeded random-weight Llama of one layer (no download, no tokenizer: the server runs with
``--skip-tokenizer-init`` and the suite sends token IDs). `start_vllm_server` runs the server with
the test's flags, its output in a log file, and raises
:class:`~tests.support.llama_server.ServerExited` when it exits before it is ready.

The flags every start takes (`BASE_FLAGS`) keep it light on a shared 2-core machine: float32 and
eager mode (no compile warm-up), ``--distributed-executor-backend uni`` (which the CPU build turns
into a worker process of its own; ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` would keep it in the engine's
process and start 8 to 13 s sooner, but then the stream merged tokens on a quiet machine, 3 chunks for
4 tokens, where the default build merges them only under load), a KV cache of a set size (``--kv-cache-memory-bytes``: no profiling run to
size it).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from cache_qualify.lab.control import free_port
from tests.support import builds_ahead, vllm_build
from tests.support.llama_server import LlamaServer, _worker_address, start_until_healthy

# a start's time out, as examples/vllm.yaml's readiness timeout: about 40 s on two idle cores, 130 to 220 s at a
# load average of 12 to 16, which the suite's own load (both workers, a llama-server beside) can reach
READY_TIMEOUT_S = 600.0
MODEL_NAME = "tiny-llama"
MAX_MODEL_LEN = 8192
KV_BYTES = 1 << 30   # 1 GiB: 2,097,152 tokens of the tiny model
# the server's environment: no hub, no usage reports, and its compute thread not pinned to core 0
# (its default), where every other start on a shared machine would pin its own too
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_DO_NOT_TRACK": "1",
       "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
# the CPU build's own KV setting overrides --kv-cache-memory-bytes: never passed on
KV_ENV = "VLLM_CPU_KVCACHE_SPACE"


def server_env() -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != KV_ENV}, **ENV}
BASE_FLAGS = ("--served-model-name", MODEL_NAME, "--max-model-len", str(MAX_MODEL_LEN), "--skip-tokenizer-init",
              "--dtype", "float32", "--enforce-eager", "--distributed-executor-backend", "uni")
SERVER_MODULE = "vllm.entrypoints.openai.api_server"   # `vllm serve` fails: the package is named vllm-cpu
# one layer of width 64 and one attention head of 64 (the CPU attention kernels take no head of 16)
TINY_LLAMA = """
import sys, torch, transformers
torch.manual_seed(int(sys.argv[2]))
config = transformers.LlamaConfig(vocab_size=32000, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                  num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=8192)
transformers.LlamaForCausalLM(config).save_pretrained(sys.argv[1])
"""


def vllm_python() -> Path:
    """The python of the installed vLLM (installed now if missing); fails the calling test if it cannot be."""
    builds_ahead.wait(builds_ahead.VLLM.name)   # the session's install, if it started one
    try:
        return vllm_build.ensure_installed()
    except vllm_build.InstallFailed as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture(scope="session")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The installed vLLM's python and the tiny model, made once for the session."""
    python = vllm_python()
    return python, make_tiny_llama(python, tmp_path_factory.mktemp("vllm-model"))


def make_tiny_llama(python: Path, folder: Path, *, seed: int = 0) -> Path:
    """A random-weight Llama (config.json and model.safetensors, 16 MB) saved in `folder`/model."""
    model = folder / "model"
    done = subprocess.run([str(python), "-c", TINY_LLAMA, str(model), str(seed)], capture_output=True, text=True,
                          env=server_env(), check=False, timeout=300)
    if done.returncode != 0:
        pytest.fail(f"making the tiny Llama with {python} failed (status {done.returncode}):\n{done.stderr[-3000:]}",
                    pytrace=False)
    return model


def server_command(python: Path, model: Path, address: str, port: int, flags: Sequence[str] = ()) -> list[str]:
    return [str(python), "-m", SERVER_MODULE, "--model", str(model), "--host", address, "--port", str(port),
            *BASE_FLAGS, "--kv-cache-memory-bytes", str(KV_BYTES), *flags]


def start_vllm_server(python: Path, model: Path, log_path: Path, flags: Sequence[str] = (), *,
                      address: str | None = None, ready_timeout_s: float = READY_TIMEOUT_S) -> LlamaServer:
    """Start the server (a later ``--kv-cache-memory-bytes`` in `flags` wins) and wait till ``/health``
    is 200. It leads a process group of its own, so a test can see that its stop leaves none behind."""
    address = address or _worker_address()
    port = free_port([address])
    return start_until_healthy("vLLM", server_command(python, model, address, port, flags), log_path, address, port,
                               ready_timeout_s, env=server_env(), new_session=True)


def group_alive(server: LlamaServer) -> bool:
    """Whether any process of the server's process group is still running."""
    try:
        os.killpg(server.process.pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_group(server: LlamaServer) -> int:
    """Stop the server (SIGTERM, then SIGKILL), then anything of its group left (there should be none)."""
    status = server.stop()
    if group_alive(server):
        os.killpg(server.process.pid, signal.SIGKILL)
    return status


@contextmanager
def running_vllm_server(python: Path, model: Path, log_path: Path, flags: Sequence[str] = (), *,
                        address: str | None = None) -> Iterator[LlamaServer]:
    """`start_vllm_server`, stopped (with its process group) on the way out."""
    server = start_vllm_server(python, model, log_path, flags, address=address)
    try:
        yield server
    finally:
        stop_group(server)
