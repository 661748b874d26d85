"""A tiny random-weight llama GGUF, made with the `gguf` package, for a real llama-server.

One layer of width 32 and a 32,000-piece SentencePiece ("llama") vocabulary: three
special tokens, the 256 byte pieces ``<0x00>``..``<0xFF>`` (llama.cpp looks up the
newline byte when it loads an SPM vocabulary) and 31,741 ordinary pieces with
scores. The weights are seeded, so a seed makes the same file byte for byte. Such a
model loads in a fraction of a second and prefills 5,000 tokens in about a second
on one core: what a prefix cache saves shows as clearly as on a real model.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

N_VOCAB = 32_000
WIDTH = 32
HEADS = 4
FFN = 64
CONTEXT = 8_192   # n_ctx_train: a server started without `-c` gets this many KV cells
UNK, BOS, EOS = 0, 1, 2
_BYTES = 256
_SPM_SPACE = "\u2581"   # SentencePiece's word-start mark


@dataclass(frozen=True)
class TinyModel:
    """A model file and what a prompt may contain: token IDs in ``first_id..last_id``."""

    path: Path
    seed: int
    n_vocab: int = N_VOCAB
    context: int = CONTEXT

    @property
    def first_id(self) -> int:
        """The first ordinary piece (after the special and byte tokens)."""
        return 3 + _BYTES

    @property
    def last_id(self) -> int:
        return self.n_vocab - 1


def _pieces() -> list[str]:
    """The vocabulary in ID order: special tokens, byte pieces, then ordinary pieces, all distinct."""
    words = ("".join(letters) for size in itertools.count(1)
             for letters in itertools.product(string.ascii_lowercase, repeat=size))
    ordinary = itertools.chain.from_iterable((_SPM_SPACE + word, word) for word in words)
    head = ["<unk>", "<s>", "</s>"] + [f"<0x{byte:02X}>" for byte in range(_BYTES)]
    return head + list(itertools.islice(ordinary, N_VOCAB - len(head)))


def make_tiny_model(folder: Path, *, seed: int = 0, context: int = CONTEXT) -> TinyModel:
    """Write the seeded tiny model as ``folder/tiny-llama-<seed>.gguf`` and describe it."""
    path = folder / f"tiny-llama-{seed}.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_context_length(context)
    writer.add_embedding_length(WIDTH)
    writer.add_block_count(1)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(HEADS)
    writer.add_rope_dimension_count(WIDTH // HEADS)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)

    pieces = _pieces()
    types = ([gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
             + [gguf.TokenType.BYTE] * _BYTES + [gguf.TokenType.NORMAL] * (N_VOCAB - 3 - _BYTES))
    # SentencePiece scores: longer (later) pieces score lower; special and byte pieces 0
    scores = [0.0] * (3 + _BYTES) + [-float(i) for i in range(N_VOCAB - 3 - _BYTES)]
    writer.add_tokenizer_model("llama")
    writer.add_token_list(pieces)
    writer.add_token_types(types)
    writer.add_token_scores(scores)
    writer.add_unk_token_id(UNK)
    writer.add_bos_token_id(BOS)
    writer.add_eos_token_id(EOS)
    writer.add_add_bos_token(True)   # as Llama's own files say: text prompts get a BOS

    rng = np.random.default_rng(seed)

    def weights(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    ones = np.ones(WIDTH, dtype=np.float32)
    # numpy shapes are ggml's reversed: token_embd is {WIDTH, N_VOCAB} to ggml; output is tied to it
    writer.add_tensor("token_embd.weight", weights(N_VOCAB, WIDTH))
    writer.add_tensor("output_norm.weight", ones)
    writer.add_tensor("blk.0.attn_norm.weight", ones)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        writer.add_tensor(f"blk.0.{name}.weight", weights(WIDTH, WIDTH))
    writer.add_tensor("blk.0.ffn_norm.weight", ones)
    writer.add_tensor("blk.0.ffn_gate.weight", weights(FFN, WIDTH))
    writer.add_tensor("blk.0.ffn_up.weight", weights(FFN, WIDTH))
    writer.add_tensor("blk.0.ffn_down.weight", weights(WIDTH, FFN))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return TinyModel(path=path, seed=seed, context=context)


def main(argv: list[str] | None = None) -> int:
    """`python -m tests.support.tiny_model PATH [--seed N]`: write the tiny model to PATH (a .gguf file),
    e.g. the model examples/llama-cpp.yaml serves: ``python -m tests.support.tiny_model /srv/models/model.gguf``."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tests.support.tiny_model", description=main.__doc__)
    parser.add_argument("path", type=Path, help="the .gguf file to write (its folder is made)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0): a seed makes the same file")
    args = parser.parse_args(argv)
    args.path.parent.mkdir(parents=True, exist_ok=True)
    model = make_tiny_model(args.path.parent, seed=args.seed)
    if model.path != args.path:
        model.path.replace(args.path)
    print(f"{args.path}: tiny llama model, seed {args.seed}, {N_VOCAB} pieces, context {CONTEXT}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
