"""
Sample from a trained bov model, streaming the text to stdout as the tokens are produced.

    python sample.py                                                       # out/cpu_bov/ckpt.pt, from <|bos|>
    python sample.py --ckpt out/cpu_baseline/ckpt.pt --start "ROMEO:" --num_samples 3
    python sample.py --start FILE:prompt.txt --temperature 0
    python sample.py --offload_tables                                      # value tables stay in host memory

Decoding uses the KV cache of model.py: the prompt is prefilled once, then every step feeds one
token. A Bank of Values layer caches no V: it keeps only the token ids and gathers gamma_v E_v[ids]
again at each step (the paper's Section 4, "Inference"). With --offload_tables the tables stay in
host memory (pinned on CUDA) and only the rows of ids not seen before in the sample cross to the device
("the lookup into E_v requires only the token indices ... only the needed entries are prefetched"):
each sample is a sequence of its own and fetches its rows anew, so the device holds one sequence's rows.

Every prompt starts with <|bos|>, as every training document does. Timings (prefill and decode
tokens per second) and the offload traffic go to stderr, so stdout holds the text alone.
"""

import codecs
import contextlib
import ctypes
import os
import signal
import sys
import time

# Ctrl-C while torch loads (a second or more): one line and exit 130, not a traceback (left ignored if it was, `cmd &`)
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    def _stopped_while_loading(*_):
        try:
            os.write(2, b"sample.py: interrupted\n")
        finally:  # exit 130 even with stderr closed (`2>&-`)
            os._exit(130)
    signal.signal(signal.SIGINT, _stopped_while_loading)

import torch

from model import GPT, check_temperature, checkpoint_file, compile_failed, first_line
from prepare_data import (ArgumentParser, DataError, handle_signals, load_tokenizer, plural, reconfigure_stdout,
                          silence_stdout, tokenizer_sha256)

SEPARATOR = "\n---------------\n"


class SampleError(Exception):
    """one-line, user-facing problem with the arguments"""


class TextStream:
    """Write token ids as text the moment they arrive. Token bytes go through an incremental UTF-8
    decoder, so a character whose bytes span several tokens is written once, whole, when its last
    byte arrives (decoding token by token would write replacement characters instead)."""

    def __init__(self, tokenizer, out):
        self.enc, self.out = tokenizer.enc, out
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def token_bytes(self, i):
        try:
            return self.enc.decode_single_token_bytes(i)
        except KeyError:  # an id the model knows but the tokenizer does not (padded vocabulary)
            return "\ufffd".encode()

    def write(self, ids):
        text = self.utf8.decode(b"".join(self.token_bytes(int(i)) for i in ids))
        if text:
            self.out.write(text)
            self.out.flush()

    def close(self):
        self.out.write(self.utf8.decode(b"", final=True))
        self.utf8.reset()
        self.out.flush()


PROMPT_FILE_LIMIT = 64 * 2**20  # characters, far past any model's context in tokens


def read_prompt(start):
    """--start text, or the contents of the file after FILE:"""
    if not start.startswith("FILE:"):
        try:
            start.encode("utf-8")  # bytes that are not UTF-8 reach argv as lone surrogates (PEP 383)
        except UnicodeEncodeError as e:
            raise SampleError(f"--start is not UTF-8 text ({e.reason} at character {e.start})") from None
        return start
    path = start[len("FILE:"):]
    try:
        with open(path, encoding="utf-8", newline="") as f:  # \r\n kept, as prepare_data.py reads training text
            text = f.read(PROMPT_FILE_LIMIT + 1)  # bounded: FILE:/dev/zero would fill the memory
    except (OSError, UnicodeDecodeError) as e:
        raise SampleError(f"cannot read the prompt file {path}: {e.strerror if isinstance(e, OSError) else e}") from None
    if len(text) > PROMPT_FILE_LIMIT:
        raise SampleError(f"the prompt file {path} is over {PROMPT_FILE_LIMIT // 2**20}M characters; the model reads at "
                          "most its context: give the part to continue from")
    if not text:
        print(f"sample.py: warning: the prompt file {path} is empty; starting from <|bos|> alone", file=sys.stderr)
    return text


def encode_prompt(tokenizer, text, block_size):
    """<|bos|> + the tokens of text; longer than block_size -> <|bos|> + the last block_size - 1 tokens
    of text, and a warning (every prompt starts with <|bos|>, as every training document does)."""
    ids = [tokenizer.bos_id] + tokenizer.encode(text)
    if len(ids) > block_size:
        print(f"sample.py: warning: the prompt has {len(ids)} tokens (with <|bos|>), more than the model's "
              f"context of {block_size}; keeping <|bos|> and the last {block_size - 1}", file=sys.stderr)
        ids = ids[:1] + ids[len(ids) - (block_size - 1):]
    return ids


def autocast(device, dtype):
    """The mixed-precision context for --dtype: autocast for bfloat16/float16, nothing for float32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def bf16_in_hardware(dev):
    """Whether CUDA device `dev` computes in bf16 natively: compute capability 8 (Ampere) and later, or ROCm.
    torch.cuda.is_bf16_supported() would say yes on a T4 or V100 too, where bf16 is only emulated (slowly, and
    torch.compile's inductor declines to compile it), and asks the current GPU rather than `dev`."""
    return bool(torch.version.hip) or torch.cuda.get_device_capability(dev)[0] >= 8


def resolve_dtype(name, device):
    """--dtype name -> torch dtype; auto = bfloat16 on a GPU with bf16 in hardware, float16 on older ones, float32 off
    CUDA."""
    if name == "auto":
        dev = torch.device(device)
        if dev.type != "cuda":
            return torch.float32
        return torch.bfloat16 if bf16_in_hardware(dev) else torch.float16
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


UNKNOWN_DEVICE = "not a device type torch knows (cpu, cuda, cuda:N, mps, ...)"  # torch's own list runs to a paragraph


def float16_remedy(dtype, verb):
    """What to add to an error about logits that are not finite: float16's remedy, where float16 was the dtype."""
    return f"; float16's range is 65504: {verb} with --dtype bfloat16 or float32" if dtype == torch.float16 else ""


def check_device(device):
    """ValueError, in one line, if tensors cannot be made on device (also used by train.py, bench.py and eval.py)."""
    try:
        if torch.device(device).type == "meta":  # shapes without data: nothing can run there
            raise RuntimeError("the meta device holds no data")
        torch.zeros(1, device=device)
    except (AssertionError, RuntimeError, NotImplementedError, ImportError) as e:
        why = first_line(e, None)
        if why.startswith("Expected one of"):  # torch lists every device type it knows: too long for one line
            why = UNKNOWN_DEVICE
        elif why.startswith("Could not run") or isinstance(e, ImportError) or "INTERNAL ASSERT" in why:
            # no kernels for the device, or no torch.hpu module to find them: a build without its backend
            why = f"this torch build has no {torch.device(device).type} backend"
        raise ValueError(f"--device {device} is not usable here: {why}") from None


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt() parameters (<malloc.h>)


def keep_freed_memory(device):
    """On the CPU under glibc (Linux), keep the memory a training step frees for the next one, as torch's caching
    allocator does on a GPU (train.py and bench.py, which times train steps). By default malloc hands every freed
    block past its mmap threshold (128 KiB, rising to 32 MiB) back to the kernel, and the next step faults it in
    again page by page: at the cpu size that was a fifth of a train step (105k page faults, 190 ms of kernel time
    in a 520 ms step of 8 x 256 tokens on 2 cores). The price: the heap never shrinks and fragments, so the
    process's resident memory peaks higher (about a third more at the cpu size). Whether it was set: not on a GPU
    (its tensors are not malloc's) nor off glibc. sample.py and eval.py leave malloc alone: decoding allocates
    little, and an evaluation's speed was not measured."""
    if torch.device(device).type != "cpu" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    # no block served by mmap (so none unmapped when freed), and the heap's free top never trimmed (-1: never)
    return bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, -1))


def checkpoint_tokenizer(ckpt_path, ckpt, vocab_size, data_dir=None):
    """The tokenizer of data_dir (--data_dir), else of the prepared data the checkpoint was trained on
    (also used by eval.py). DataError, in one line, when it is not there or is larger than the model's."""
    if not data_dir:
        data_dir = ckpt.get("data_dir")
        if not data_dir:
            raise DataError(f"{ckpt_path} does not say which data (and tokenizer) it was trained on; pass --data_dir")
        if not os.path.isdir(data_dir):  # e.g. a checkpoint from another machine, or a relative path from elsewhere
            raise DataError(f"{ckpt_path} was trained on the data in {data_dir}, which is not here; pass --data_dir")
    tokenizer = load_tokenizer(data_dir)
    if tokenizer.vocab_size > vocab_size:
        raise DataError(f"the tokenizer of {data_dir} has {tokenizer.vocab_size} tokens, the model only {vocab_size}")
    if ckpt.get("tokenizer_sha256") not in (None, tokenizer_sha256(data_dir)):
        raise DataError(f"the tokenizer of {data_dir} is not the one {ckpt_path} was trained with (its SHA-256 differs: "
                        f"the folder was prepared again since, or is another); pass --data_dir with the data it was "
                        f"trained on, or prepare that again (its vocabulary: {vocab_size} tokens)")
    return tokenizer


def load(ckpt_path, device, data_dir=None, offload_tables=False):
    """(model in eval mode, tokenizer) for a train.py checkpoint. With offload_tables the model runs
    on `device` and its value tables stay in host memory (model.offload_tables)."""
    ckpt_path = checkpoint_file(ckpt_path)  # a run's folder: its ckpt.pt
    model, ckpt = GPT.from_checkpoint(ckpt_path, "cpu" if offload_tables else device)
    if offload_tables:
        model.offload_tables(device)
    return model, checkpoint_tokenizer(ckpt_path, ckpt, model.config.vocab_size, data_dir)


def sample_one(model, tokenizer, prompt_ids, args, generator, out):
    """Stream one sample (the prompt, then each new token) to `out`; return (prompt tokens, prefill
    seconds, decoded tokens, decode seconds). The first new token comes out of the prefill, every
    later one out of a one-token decode step, but for each step at which a full cache restarts from the last
    half block (past block_size; GPT.stream), whose prefill counts as decode time. prompt_ids starts with
    <|bos|> (encode_prompt), not printed."""
    stream = TextStream(tokenizer, out)
    stream.write(prompt_ids[1:])
    idx = torch.tensor([prompt_ids], dtype=torch.long, device=args.device)
    t0 = time.perf_counter()
    t_first, n = None, 0
    for tok in model.stream(idx, args.max_new_tokens, args.temperature, args.top_k, generator=generator):  # top_k 0: all
        stream.write(tok[0].tolist())  # .tolist() waits for the device: the timings are real
        n += 1
        if t_first is None:
            t_first = time.perf_counter()
    t_end = time.perf_counter()
    stream.close()
    if t_first is None:  # --max_new_tokens 0: the prompt was written, no forward pass ran
        return 0, 0.0, 0, 0.0
    return len(prompt_ids), t_first - t0, n - 1, t_end - t_first


def rate(tokens, seconds):
    if not (seconds > 0 and tokens):
        return "n/a"
    r = tokens / seconds
    return f"{r:,.1f} tok/s" if r >= 1 else f"{r:.2g} tok/s"  # e.g. a prefill that includes compiling


def parse_args(argv=None):
    p = ArgumentParser(
        prog="sample.py", nanogpt={"--out_dir": "--ckpt", "--init_from": "--ckpt"},
        description="Sample text from a bov checkpoint, streamed to stdout; timings go to stderr.",
        epilog="A prompt longer than the model's context (block_size tokens, <|bos|> included) is cropped "
               "to <|bos|> and its last block_size - 1 tokens, with a warning. Generation past the context goes on: when "
               "the cache is full it restarts from the last half block.")
    p.add_argument("--ckpt", default="out/cpu_bov/ckpt.pt",
                   help="checkpoint written by train.py, or its run folder (default: out/cpu_bov/ckpt.pt, what a plain "
                   "`python train.py` writes)")
    p.add_argument("--data_dir", help="prepared-data folder whose tokenizer to use (default: the one in the checkpoint)")
    p.add_argument("--start", default="", help="prompt text, or FILE:path to read it from a file; "
                   "<|bos|> is always put first (default: empty, i.e. <|bos|> alone)")
    p.add_argument("--num_samples", type=int, default=1, help="samples drawn one after the other (default 1)")
    p.add_argument("--max_new_tokens", type=int, default=256, help="tokens generated per sample (default 256)")
    p.add_argument("--temperature", type=float, default=0.8, help="0 = greedy; 1 = the model's distribution (default 0.8)")
    p.add_argument("--top_k", type=int, default=200, help="sample from the k most likely tokens only; 0 = all (default 200)")
    p.add_argument("--seed", type=int, default=1337, help="seed of the sampling generator (default 1337)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu | cuda | cuda:N | mps")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="autocast dtype; auto = bfloat16 on CUDA from Ampere (compute capability 8) on, "
                        "float16 before, float32 elsewhere")
    p.add_argument("--compile", action="store_true", help="torch.compile the model with dynamic shapes (the "
                   "cached context grows every step); the first steps are slow while it compiles")
    p.add_argument("--offload_tables", action="store_true", help="keep the value tables in host memory and fetch "
                   "the rows of new token ids to the device ahead of the layer; reports rows and bytes moved")
    args = p.parse_args(argv)
    for name, low in (("num_samples", 1), ("max_new_tokens", 0), ("top_k", 0)):
        if getattr(args, name) < low:
            p.error(f"--{name} must be at least {low}, got {getattr(args, name)}")
    try:
        check_temperature(args.temperature)  # also refuses nan
    except ValueError as e:
        p.error(f"--{e}")
    if not -2 ** 63 <= args.seed < 2 ** 64:  # what torch.Generator.manual_seed takes
        p.error(f"--seed must be in [-2^63, 2^64), got {args.seed}")
    return args


def main(argv=None):
    args = parse_args(argv)
    if sys.stdout is None:  # started with stdout closed (`>&-`): nowhere to write the text
        sys.exit("sample.py: error: stdout is closed; the text has nowhere to go")
    try:
        check_device(args.device)
        dtype = resolve_dtype(args.dtype, args.device)
        model, tokenizer = load(args.ckpt, args.device, args.data_dir, args.offload_tables)
        ids = encode_prompt(tokenizer, read_prompt(args.start), model.config.block_size)
    except (SampleError, DataError, FileNotFoundError, ValueError) as e:
        sys.exit(f"sample.py: error: {first_line(e, None)}")
    except KeyboardInterrupt:  # while loading the checkpoint
        print("sample.py: interrupted", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT, as a shell reports Ctrl-C
    cfg = model.config
    if args.offload_tables and not len(model.tables):
        print("sample.py: note: this model has no value tables; --offload_tables changes nothing", file=sys.stderr)
    if args.compile:
        model.compile(dynamic=True)
    generator = torch.Generator(device=args.device).manual_seed(args.seed)
    print(f"sample.py: {cfg.n_layer} layers, d={cfg.n_embd}, vocab {cfg.vocab_size}, context {cfg.block_size}; "
          f"layers without a V cache: {', '.join(map(str, cfg.v_free_layers())) or 'none'}; "
          f"KV cache {cfg.kv_cache_bytes(1, 1, dtype):,} bytes/token; "
          f"{dtype} on {args.device}", file=sys.stderr)
    totals, interrupted = [0, 0.0, 0, 0.0], False
    try:
        with torch.no_grad(), autocast(args.device, dtype):
            for k in range(args.num_samples):
                if k:
                    sys.stdout.write(SEPARATOR)
                totals = [a + b for a, b in zip(totals, sample_one(model, tokenizer, ids, args, generator, sys.stdout))]
                sys.stdout.write("\n")
                sys.stdout.flush()
    except KeyboardInterrupt:  # the samples finished so far are reported below, then exit 130
        sys.stdout.write("\n")
        print("sample.py: interrupted", file=sys.stderr)
        interrupted = True
    except OSError as e:  # the reader left (`python sample.py | head`: stop quietly, like cat), or a full disk
        silence_stdout()
        sys.exit(1 if isinstance(e, BrokenPipeError) else f"sample.py: error: cannot write the text: {e.strerror or e}")
    except FloatingPointError as e:  # GPT.stream: logits NaN or inf (float16 overflows, or a diverged checkpoint)
        sys.stdout.write("\n")
        sys.exit(f"sample.py: error: {e}{float16_remedy(dtype, 'sample')}")
    except Exception as e:
        if args.compile and compile_failed(e):
            sys.exit(f"sample.py: error: torch.compile failed ({first_line(e)}); run without --compile")
        raise
    n_prompt, t_prefill, n_decode, t_decode = totals
    if n_prompt:
        print(f"sample.py: prefill {plural(n_prompt, 'token')} at {rate(n_prompt, t_prefill)}; "
              f"decode {plural(n_decode, 'token')} at {rate(n_decode, t_decode)}"
              + (" (both include compiling)" if args.compile else ""), file=sys.stderr)
    elif interrupted:
        print("sample.py: no sample finished, so no speeds are reported", file=sys.stderr)
    else:
        print("sample.py: no tokens generated, so no prefill or decode ran", file=sys.stderr)
    if model.offload is not None:
        on_host = " (on the CPU the model is in host memory too: the same path runs, as a check)" \
            if torch.device(args.device).type == "cpu" else ""
        each = " (each sample fetches its own rows)" if args.num_samples > 1 else ""
        print(f"sample.py: offload: {model.offload.rows_fetched:,} table rows fetched{each}, "
              f"{model.offload.bytes_moved:,} bytes moved host -> {args.device}{on_host}", file=sys.stderr)
    if interrupted:
        sys.exit(130)


if __name__ == "__main__":
    handle_signals({signal.SIGINT: signal.default_int_handler})  # loaded: Ctrl-C is a KeyboardInterrupt again
    reconfigure_stdout()
    main()
