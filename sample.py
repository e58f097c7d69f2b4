"""
Sample from a trained model, streaming the text to stdout as the tokens come.

    python sample.py                                    # out/cpu_bov, the default `python train.py` run
    python sample.py --ckpt out/cpu_baseline --start "ROMEO:" --num_samples 3
    python sample.py --start FILE:prompt.txt --temperature 0
    python sample.py --offload_tables                   # the value tables stay in host memory

The prompt is prefilled into the KV cache once, then every step feeds one token. A BoV layer caches no V:
it keeps the token ids and reads gamma_v E_v[ids] again at each step (Section 4). With --offload_tables the
tables stay in host memory and only the rows of ids not seen before cross to the device. Timings and the
offload traffic go to stderr, so stdout holds the text alone.
"""
import argparse
import codecs
import sys
import time

import torch

from model import GPT, load_tokenizer


def read_prompt(enc, start, block_size):
    """<|bos|> + the tokens of --start (text, or FILE:path), cropped from the left to block_size tokens."""
    if start.startswith("FILE:"):
        with open(start[5:], encoding="utf-8") as f:
            start = f.read()
    ids = enc.encode_ordinary(start)
    if len(ids) + 1 > block_size:
        print(f"prompt cropped to the context: <|bos|> and its last {block_size - 1} tokens", file=sys.stderr)
        ids = ids[-(block_size - 1):]
    return [enc.n_vocab - 1] + ids  # every training document starts with <|bos|>


def sample(model, enc, ids, args, generator):
    """Stream one sample to stdout, the prompt then each token as it comes -> (prefill s, decode s, tokens)."""
    utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a character split over tokens: once, whole
    sys.stdout.write(enc.decode(ids[1:]))
    idx = torch.tensor([ids], device=args.device)
    t0 = t1 = time.perf_counter()
    n = 0
    for tok in model.stream(idx, args.max_new_tokens, args.temperature, args.top_k, generator=generator):
        sys.stdout.write(utf8.decode(enc.decode_bytes([tok.item()])))  # .item() waits for the device
        sys.stdout.flush()
        n += 1
        if n == 1:
            t1 = time.perf_counter()  # the first token comes out of the prefill
    sys.stdout.write(utf8.decode(b"", final=True) + "\n")
    return t1 - t0, time.perf_counter() - t1, n


def main(argv=None):
    p = argparse.ArgumentParser(description="Sample from a train.py checkpoint; the text streams to stdout.")
    p.add_argument("--ckpt", default="out/cpu_bov", help="ckpt.pt, or the out_dir holding it")
    p.add_argument("--start", default="", help="prompt text, or FILE:path (default: <|bos|> alone)")
    p.add_argument("--num_samples", type=int, default=1)
    p.add_argument("--max_new_tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy")
    p.add_argument("--top_k", type=int, default=200)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="bfloat16" if torch.cuda.is_available() else "float32",
                   choices=["float32", "bfloat16", "float16"], help="autocast dtype")
    p.add_argument("--compile", action="store_true", help="torch.compile, dynamic shapes")
    p.add_argument("--offload_tables", action="store_true", help="keep the value tables in host memory")
    args = p.parse_args(argv)

    model, ckpt = GPT.from_checkpoint(args.ckpt, "cpu" if args.offload_tables else args.device)
    if args.offload_tables:
        model.offload_tables(args.device)
    if args.compile:
        model.compile(dynamic=True)
    enc = load_tokenizer(ckpt["tokenizer"])
    ids = read_prompt(enc, args.start, model.config.block_size)
    dtype = getattr(torch, args.dtype)
    generator = torch.Generator(args.device).manual_seed(args.seed)
    with torch.no_grad(), torch.autocast(torch.device(args.device).type, dtype, enabled=dtype != torch.float32):
        for k in range(args.num_samples):
            if k:
                print("---------------")
            prefill_s, decode_s, n = sample(model, enc, ids, args, generator)
            if n:
                decode = (n - 1) / max(decode_s, 1e-9)
                print(f"prefill {len(ids) / prefill_s:,.1f} tok/s, decode {decode:,.1f} tok/s", file=sys.stderr)
    if model.offload is not None:
        rows = model.offload.rows  # (tables, rows fetched, C): what crossed to the device
        print(f"offload: {rows.shape[0] * rows.shape[1]:,} table rows fetched, {rows.nbytes:,} bytes moved to "
              f"{args.device}", file=sys.stderr)


if __name__ == "__main__":
    main()
