"""
CORE: the 21 in-context tasks of DCLM that the paper reports (Section 5, Tables 2 and 4).

    python eval.py --ckpt out/cpu_bov                          # all 21 tasks -> out/cpu_bov/core_eval.json
    python eval.py --ckpt out/cpu_bov --max_per_task 100       # a quick estimate -> core_eval_partial.json
    python eval.py --ckpt out/cpu_bov --tasks arc_easy,squad --bundle ~/eval_bundle

A prompt is <|bos|>, a few solved examples of the task (drawn with a fixed seed from its other items), each
followed by a blank line, then the item; a prompt longer than the model's block_size is cropped from the left.
Three kinds of task, three rules:
    multiple choice    {"query", "choices", "gold"}: the choice with the lowest loss per byte of its tokens
    schema             {"context_options", "continuation", "gold"}: the context under which the shared
                       continuation has the lowest loss
    language modelling {"context", "continuation"}: right when greedy decoding gives every continuation token
Centered accuracy is (acc - r) / (1 - r), r the task's random baseline; CORE is the mean centered accuracy.

The data is nanochat's eval_bundle.zip, unzipped: eval_meta_data.csv ("Eval Task", "Random baseline" in %) and
eval_data/<category>/<task>.jsonl. Without --bundle it is downloaded once into ~/.cache/bov/eval_bundle.
"""

import argparse
import csv
import io
import json
import os
import random
import sys
import tempfile
import urllib.request
import zipfile
from collections import namedtuple

import torch
import torch.nn.functional as F

from model import GPT, load_tokenizer

BUNDLE_URL = "https://karpathy-public.s3.us-west-2.amazonaws.com/eval_bundle.zip"
CACHE = os.path.expanduser("~/.cache/bov/eval_bundle")

# The tasks as the paper's code configures them (RiddleHe/nanochat, branch research/bank_of_values,
# configs/core.yaml): file under eval_data/ (.jsonl), kind, few-shot examples, and the text between question
# and answer. ARC-Easy and ARC-Challenge are 25-shot and Winogrande 5-shot there (nanochat now: 10, 10, 0).
Task = namedtuple("Task", "path kind shots delimiter")
ANSWER = "\nAnswer: "
TASKS = {
    "jeopardy": Task("world_knowledge/jeopardy_all", "lm", 10, ANSWER),
    "bigbench_qa_wikidata": Task("world_knowledge/bigbench_qa_wikidata", "lm", 10, " "),
    "arc_easy": Task("world_knowledge/arc_easy", "mc", 25, ANSWER),
    "arc_challenge": Task("world_knowledge/arc_challenge", "mc", 25, ANSWER),
    "copa": Task("commonsense_reasoning/copa", "mc", 0, " "),
    "commonsense_qa": Task("commonsense_reasoning/commonsense_qa", "mc", 10, " "),
    "piqa": Task("commonsense_reasoning/piqa", "mc", 10, ANSWER),
    "openbook_qa": Task("commonsense_reasoning/openbook_qa", "mc", 0, " "),
    "lambada_openai": Task("language_understanding/lambada_openai", "lm", 0, " "),
    "hellaswag": Task("language_understanding/hellaswag", "mc", 10, " "),
    "winograd": Task("language_understanding/winograd_wsc", "schema", 0, " "),
    "winogrande": Task("language_understanding/winogrande", "schema", 5, " "),
    "bigbench_dyck_languages": Task("symbolic_problem_solving/bigbench_dyck_languages", "lm", 10, " "),
    "agi_eval_lsat_ar": Task("symbolic_problem_solving/agi_eval_lsat_ar", "mc", 3, " "),
    "bigbench_cs_algorithms": Task("symbolic_problem_solving/bigbench_cs_algorithms", "lm", 10, " "),
    "bigbench_operators": Task("symbolic_problem_solving/bigbench_operators", "lm", 10, " "),
    "bigbench_repeat_copy_logic": Task("symbolic_problem_solving/bigbench_repeat_copy_logic", "lm", 10, " "),
    "squad": Task("reading_comprehension/squad", "lm", 10, " "),
    "coqa": Task("reading_comprehension/coqa", "lm", 0, " "),
    "boolq": Task("reading_comprehension/boolq", "mc", 10, ANSWER),
    "bigbench_language_identification":
        Task("language_understanding/bigbench_language_identification", "mc", 10, " "),
}
SUBSET_SEED = 1337   # --max_per_task takes the first items of this shuffle (nanochat's)
FEWSHOT_SEED = 1234  # item i of the shuffled task draws its examples with Random(FEWSHOT_SEED + i)

# -----------------------------------------------------------------------------
# The bundle


def get_bundle(path=None):
    """The unzipped bundle folder: path, else the cache, downloaded into it once."""
    if path or os.path.isdir(CACHE):
        return path or CACHE
    print(f"downloading {BUNDLE_URL} to {CACHE}", file=sys.stderr)
    try:
        with urllib.request.urlopen(BUNDLE_URL, timeout=60) as r:
            data = r.read()
    except OSError as e:  # urllib's URLError: no network, no DNS, a refused connection, a timeout
        sys.exit(f"eval.py: cannot reach {BUNDLE_URL} ({getattr(e, 'reason', e)}); to run offline, "
                 f"download and unzip it elsewhere and pass --bundle path/to/eval_bundle")
    os.makedirs(os.path.dirname(CACHE), exist_ok=True)
    with tempfile.TemporaryDirectory(dir=os.path.dirname(CACHE)) as tmp:
        zipfile.ZipFile(io.BytesIO(data)).extractall(tmp)
        os.rename(os.path.join(tmp, "eval_bundle"), CACHE)  # atomic: the cache is the whole bundle or absent
    return CACHE


def load_baselines(bundle):
    """{task: its random baseline as a fraction} from eval_meta_data.csv."""
    with open(os.path.join(bundle, "eval_meta_data.csv"), newline="", encoding="utf-8") as f:
        return {row["Eval Task"]: float(row["Random baseline"]) / 100 for row in csv.DictReader(f)}


def load_task(bundle, label):
    with open(os.path.join(bundle, "eval_data", TASKS[label].path + ".jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]

# -----------------------------------------------------------------------------
# Prompts


def fewshot(n, i, k):
    """k distinct indices of [0, n) but i: nanochat's draw from the list of the others, without the list."""
    rng = random.Random(FEWSHOT_SEED + i)
    return [j + (j >= i) for j in rng.sample(range(n - 1), min(k, n - 1))]


def render(task, item, shots):
    """The texts of an item after its solved examples: one per choice (mc), one per context option (schema),
    or the prompt without and with the continuation (lm)."""
    d = task.delimiter
    if task.kind == "mc":
        head = "".join(f"{s['query']}{d}{s['choices'][s['gold']]}\n\n" for s in shots)
        return [f"{head}{item['query']}{d}{c}" for c in item["choices"]]
    if task.kind == "schema":
        head = "".join(f"{s['context_options'][s['gold']]}{d}{s['continuation']}\n\n" for s in shots)
        return [f"{head}{c}{d}{item['continuation']}" for c in item["context_options"]]
    head = "".join(f"{s['context'].strip()}{d}{s['continuation']}\n\n" for s in shots)
    prompt = f"{head}{item['context'].strip()}{d}"
    return [prompt.strip(), prompt + item["continuation"]]  # the delimiter's space joins the continuation


def common_length(seqs):
    """The length of the prefix that all the sequences share."""
    n = min(len(s) for s in seqs)
    return next((k for k in range(n) if len({s[k] for s in seqs}) > 1), n)


def crop(tokens, start, block_size):
    """Keep the last block_size tokens; tokens[start:] is scored (position 0 predicts nothing)."""
    cut = max(0, len(tokens) - block_size)
    return tokens[cut:], max(1, start - cut)


def encode(kind, texts, enc, block_size):
    """[(tokens, start)] with tokens[start:] the scored part of each text, at least one token: what follows
    the choices' shared prefix (mc), the options' shared suffix (schema), or the continuation (lm)."""
    toks = [[enc.n_vocab - 1] + enc.encode_ordinary(t) for t in texts]  # <|bos|> is the last id
    shortest = min(len(t) for t in toks) - 1
    if kind == "mc":
        spans = [(t, min(common_length(toks), shortest)) for t in toks]
    elif kind == "schema":
        n = min(common_length([t[::-1] for t in toks]), shortest)
        spans = [(t, len(t) - n) for t in toks]
    else:
        spans = [(toks[1], min(common_length(toks), len(toks[1]) - 1))]
    return [crop(t, s, block_size) for t, s in spans]

# -----------------------------------------------------------------------------
# Scoring


@torch.no_grad()
def score(model, rows, batch_size=16, device="cpu", dtype=torch.float32):
    """For rows [(tokens, start)]: the summed loss of tokens[start:], each given the tokens before it, and
    whether greedy decoding gives all of them. Rows of similar length share a batch, padded on the right
    (a causal model never sees the padding)."""
    losses, greedy = [0.0] * len(rows), [False] * len(rows)
    order = sorted(range(len(rows)), key=lambda r: len(rows[r][0]))
    for b in range(0, len(order), batch_size):
        batch = order[b:b + batch_size]
        T = len(rows[batch[-1]][0])
        idx = torch.zeros(len(batch), T, dtype=torch.long)
        scored = torch.zeros(len(batch), T - 1, dtype=torch.bool)  # position p predicts token p + 1
        for j, r in enumerate(batch):
            tokens, start = rows[r]
            idx[j, :len(tokens)] = torch.tensor(tokens)
            scored[j, start - 1:len(tokens) - 1] = True
        idx, scored = idx.to(device), scored.to(device)
        with torch.autocast(torch.device(device).type, dtype=dtype, enabled=dtype != torch.float32):
            logits, _ = model(idx)
        logits, targets = logits[:, :-1].float(), idx[:, 1:]
        loss = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
        summed = (loss * scored).sum(1).tolist()
        right = ((logits.argmax(-1) == targets) | ~scored).all(1).tolist()
        for j, r in enumerate(batch):
            losses[r], greedy[r] = summed[j], right[j]
    return losses, greedy


def evaluate_task(model, enc, task, items, n, batch_size=16, device="cpu", dtype=torch.float32):
    """Accuracy on the first n items; item i's solved examples come from all the items but i."""
    rows, first = [], [0]  # item i's rows: rows[first[i]:first[i + 1]]
    for i in range(n):
        shots = [items[j] for j in fewshot(len(items), i, task.shots)]
        rows += encode(task.kind, render(task, items[i], shots), enc, model.config.block_size)
        first.append(len(rows))
    losses, greedy = score(model, rows, batch_size, device, dtype)
    correct = 0
    for i in range(n):
        a, b = first[i], first[i + 1]
        if task.kind == "lm":
            correct += greedy[a]
        else:  # loss per byte, as the paper's code (lm-eval-harness's acc_norm); a schema's: all equal
            per_byte = [loss / len(enc.decode_bytes(t[s:])) for loss, (t, s) in zip(losses[a:b], rows[a:b])]
            correct += per_byte.index(min(per_byte)) == items[i]["gold"]  # a tie: the first
    return correct / n


def evaluate_core(model, enc, bundle, tasks=tuple(TASKS), max_per_task=None, batch_size=16, device="cpu",
                  dtype=torch.float32):
    """{"core", "tasks": {label: {"kind", "shots", "items", "accuracy", "random_baseline", "centered"}}}.
    max_per_task scores the first items of a fixed shuffle; the examples come from the whole task."""
    baselines, results = load_baselines(bundle), {}
    for label in tasks:
        task, items = TASKS[label], load_task(bundle, label)
        random.Random(SUBSET_SEED).shuffle(items)
        n = min(max_per_task or len(items), len(items))
        acc = evaluate_task(model, enc, task, items, n, batch_size, device, dtype)
        r = baselines[label]
        centered = (acc - r) / (1 - r)
        results[label] = dict(kind=task.kind, shots=min(task.shots, len(items) - 1), items=n, accuracy=acc,
                              random_baseline=r, centered=centered)
        print(f"{label:<33} {task.kind:<6} {n:>6} items  accuracy {acc:.4f}  centered {centered:+.4f}")
    return {"core": sum(v["centered"] for v in results.values()) / len(results), "tasks": results}


def main(argv=None):
    cuda = torch.cuda.is_available()
    p = argparse.ArgumentParser(description="Evaluate a checkpoint on CORE; writes core_eval.json beside it "
                                "(core_eval_partial.json with --tasks or --max_per_task).")
    p.add_argument("--ckpt", required=True, help="train.py's checkpoint, or its out_dir")
    p.add_argument("--tasks", help=f"comma-separated, of: {', '.join(TASKS)} (default: all)")
    p.add_argument("--max_per_task", type=int, help="the first N items of each task after a fixed shuffle")
    p.add_argument("--bundle", help=f"unzipped eval_bundle folder (default: {CACHE}, downloaded once)")
    p.add_argument("--batch_size", type=int, default=16)
    p.add_argument("--device", default="cuda" if cuda else "cpu")
    p.add_argument("--dtype", default="bfloat16" if cuda else "float32",
                   choices=["float32", "bfloat16", "float16"], help="autocast dtype")
    args = p.parse_args(argv)
    tasks = args.tasks.split(",") if args.tasks else list(TASKS)
    assert set(tasks) <= set(TASKS), f"--tasks: the tasks are {', '.join(TASKS)}"
    assert args.max_per_task is None or args.max_per_task > 0, "--max_per_task must be at least 1"
    bundle = get_bundle(args.bundle)
    model, ckpt = GPT.from_checkpoint(args.ckpt, args.device)
    enc = load_tokenizer(ckpt["tokenizer"])
    result = evaluate_core(model, enc, bundle, tasks, args.max_per_task, args.batch_size, args.device,
                           getattr(torch, args.dtype))
    print(f"CORE {result['core']:.4f} ({len(tasks)} tasks)")
    result.update(ckpt=os.path.abspath(args.ckpt), step=ckpt.get("step"), max_per_task=args.max_per_task,
                  bundle=os.path.abspath(bundle))
    partial = args.tasks is not None or args.max_per_task is not None  # never replaces a full result
    folder = args.ckpt if os.path.isdir(args.ckpt) else os.path.dirname(args.ckpt)
    out = os.path.join(folder, "core_eval_partial.json" if partial else "core_eval.json")
    with open(out + ".tmp", "w") as f:
        json.dump(result, f, indent=2)
    os.replace(out + ".tmp", out)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
