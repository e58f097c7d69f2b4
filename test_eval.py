"""Tests for eval.py: scoring of the three task kinds against a model with known predictions,
few-shot prompts, centered accuracy and CORE, cropping, batching, the bundle (local, cached,
downloaded, missing) and the CLI end to end on a tiny real model.
Run: python -m pytest -q test_eval.py"""

import csv
import http.server
import json
import math
import os
import random
import re
import signal
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import zipfile
from types import SimpleNamespace

import pytest
import tiktoken
import torch
import torch.nn.functional as F

import eval as ev
from conftest import finish, flip_tensor_byte
import prepare_data as pd
from model import GPT, GPTConfig

HERE = os.path.dirname(os.path.abspath(__file__))


# ---------------------------------------------------------------------------- fakes

class CharTokenizer:
    """One token per ASCII character, and id 1 for the 3-byte euro sign (a token of several bytes);
    bos is id 0 (NUL, never in the text)."""
    bos_id, vocab_size = 0, 128

    def encode(self, text):
        text = text.replace("\u20ac", "\x01")
        assert all(0 < ord(c) < 128 for c in text), text
        return [ord(c) for c in text]

    def decode(self, ids):
        return "".join(chr(int(i)) for i in ids).replace("\x01", "\u20ac")

    def decode_bytes(self, ids):
        return self.decode(ids).encode("utf-8")


class RuleModel(torch.nn.Module):
    """A model whose every prediction is known. After a letter a-y it expects the next letter;
    after a space, 'y' if the current line has a '!' so far, else 'a'; after anything else, a
    space. The expected token gets logit 10, all others 0, so its loss is log(1 + 127 e^-10)
    (about 0.006) and any other token's about 10."""

    def __init__(self, block_size=4096):
        super().__init__()
        self.config = SimpleNamespace(block_size=block_size, vocab_size=128)
        self.seen = []  # every batch of ids it was called with

    def forward(self, idx):
        assert idx.dim() == 2 and idx.size(1) <= self.config.block_size
        self.seen.append(idx.clone())
        nxt = torch.full((128,), ord(" "))
        nxt[ord("a"):ord("z")] = torch.arange(ord("b"), ord("z") + 1)
        nxt = nxt[idx]
        pos = torch.arange(idx.size(1)).expand_as(idx)
        last = lambda c: torch.where(idx == ord(c), pos, -1).cummax(1).values
        bang = last("!") > last("\n")  # a '!' since the last newline
        nxt = torch.where(idx == ord(" "), torch.where(bang, ord("y"), ord("a")), nxt)
        return 10.0 * F.one_hot(nxt, 128).float(), None


GOOD = math.log(1 + 127 * math.exp(-10))  # loss of the expected token
BAD = GOOD + 10                            # loss of any other


# ---------------------------------------------------------------------------- fixture tasks
# Every item carries "_right": whether RuleModel must get it right. eval.py ignores extra fields.

def mc_item(i, n_choices, winner, right):
    """The winner "abcdefgz" has 7 expected tokens and one wrong: ~1.26 per byte (and per token),
    sum ~10.05. Every other choice starts with a wrong token: ~10 per byte, and "z" has a smaller
    *sum* (~10.01) than the winner, so a scorer of plain sums gets every item backwards."""
    losers = ["z", "mz", "qq", "zz"][:n_choices - 1]
    choices = losers[:winner] + ["abcdefgz"] + losers[winner:]
    gold = winner if right else (winner + 1) % n_choices
    return {"query": f"question {i}", "choices": choices, "gold": gold, "_right": right}


def schema_item(i, winner, right):
    """Only the option with '!' makes the shared continuation "yz" expected after the space."""
    options = [f"case {i} said it quietly.", f"case {i} said it!"]
    if winner == 0:
        options.reverse()
    return {"context_options": options, "continuation": "yz", "gold": winner if right else 1 - winner, "_right": right}


def lm_item(i, continuation):
    """After the delimiter the model expects a, b, c, ...: "a" and "abcd" are right, "abd" has
    its first two tokens right but not the third, "zz" is wrong at once. Trailing spaces of the
    context are trimmed, so the '.' is followed by the delimiter, which the model expects."""
    return {"context": f"story {i} is long.  ", "continuation": continuation, "_right": "abcdefghijklmnopqrstuvwxy".startswith(continuation)}


def fixture_items(label, n, seed=0):
    """n items of the task's kind, right or wrong in a seeded pattern."""
    rng = random.Random(seed)
    kind = ev.TASKS[label].kind
    if kind == "mc":
        sizes = [rng.randint(2, 5) for _ in range(n)]
        return [mc_item(i, k, rng.randrange(k), rng.random() < 0.6) for i, k in enumerate(sizes)]
    if kind == "schema":
        return [schema_item(i, rng.randrange(2), rng.random() < 0.6) for i in range(n)]
    return [lm_item(i, rng.choice(["abcd", "abcdef", "abd", "zz", "a"])) for i in range(n)]


BASELINES = {label: 25.0 for label in ev.TASKS}
BASELINES.update(copa=50.0, winograd=50.0, winogrande=50.0, squad=0.0, lambada_openai=0.0, jeopardy=0.0,
                 bigbench_language_identification=9.1)


def write_bundle(root, tasks, baselines=BASELINES):
    """{label: items} -> root/eval_bundle in the DCLM layout; returns its path."""
    bundle = root / "eval_bundle"
    for label, items in tasks.items():
        path = bundle / "eval_data" / ev.TASKS[label].path
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(item) + "\n" for item in items), encoding="utf-8")
    with open(bundle / "eval_meta_data.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(["Eval Task", "Task Category", "Task Type", "#shots", "#datapoints", "Random baseline",
                    "Centered Metric?", "Description"])
        for label, r in baselines.items():
            w.writerow([label, "some category", "some type", ev.TASKS[label].shots, 0, r, "", "text, with a comma"])
    return str(bundle)


def expected_accuracy(items, n=None):
    """The share of "_right" items among the first n after eval.py's fixed shuffle."""
    items = list(items)
    random.Random(1337).shuffle(items)
    items = items[:n or len(items)]
    return sum(it["_right"] for it in items) / len(items)


# ---------------------------------------------------------------------------- scoring

@pytest.mark.parametrize("label", ["copa", "arc_easy", "winograd", "lambada_openai", "squad", "jeopardy"])
def test_each_kind_scores_exactly_what_the_model_predicts(tmp_path, label):
    items = fixture_items(label, 40, seed=len(label))
    assert 0 < expected_accuracy(items) < 1
    bundle = write_bundle(tmp_path, {label: items})
    res = ev.evaluate_core(RuleModel(), CharTokenizer(), bundle, tasks=[label], batch_size=7)
    assert res["tasks"][label]["accuracy"] == pytest.approx(expected_accuracy(items), abs=1e-12)
    assert res["tasks"][label]["items"] == 40 and res["tasks"][label]["shots"] == ev.TASKS[label].shots
    if ev.TASKS[label].shots > 2:  # a task with fewer other items than its shots: the count drawn, not the task's
        small = ev.evaluate_core(RuleModel(), CharTokenizer(), write_bundle(tmp_path / "small", {label: items[:3]}), tasks=[label])
        assert small["tasks"][label]["shots"] == 2


def test_multiple_choice_ranks_by_loss_per_byte_not_per_token_or_summed():
    """As the paper's code does (lm-eval-harness's acc_norm). "az" has one wrong token of two: summed
    loss ~10, 2 bytes, 2 tokens. "\u20ac\u20ac" has two wrong tokens: ~20, but 6 bytes. Per byte
    the euros win (3.3 < 5); per token (10 > 5) or summed (20 > 10) they would lose."""
    task, tok = ev.TASKS["copa"], CharTokenizer()
    item = {"query": "question 0", "choices": ["az", "\u20ac\u20ac"], "gold": 1}
    rows = ev.encode(task, ev.render(task, item, []), tok, 4096)
    losses, _ = ev.score(RuleModel(), rows, 2, "cpu", 0)
    assert losses == pytest.approx([GOOD + BAD, 2 * BAD])
    assert [e - s for _, s, e in rows] == [2, 2]
    assert [ev.per_byte(loss, row, tok) for loss, row in zip(losses, rows)] == pytest.approx([(GOOD + BAD) / 2, 2 * BAD / 6])
    assert ev.evaluate_task(RuleModel(), tok, "copa", [item]) == 1.0
    assert ev.evaluate_task(RuleModel(), tok, "copa", [dict(item, gold=0)]) == 0.0
    # a tie goes to the first of the tied choices (argmin), so an untrained model is not biased to the last
    tie = {"query": "question 0", "choices": ["zq", "zq"], "gold": 0}
    assert ev.evaluate_task(RuleModel(), tok, "copa", [tie]) == 1.0
    assert ev.evaluate_task(RuleModel(), tok, "copa", [dict(tie, gold=1)]) == 0.0


def test_bytes_per_choice_count_a_character_split_between_the_prefix_and_the_span():
    """With byte-level tokens "\u00e9t\u00e9" and "\u00e8re" share their first byte (0xC3): each scored span
    starts inside a character, and its bytes are 4 and 3 (decoding them as text gives U+FFFD, 6 and 5)."""
    import tiktoken
    enc = tiktoken.Encoding("bytes", pat_str=r".", mergeable_ranks={bytes([i]): i for i in range(256)},
                            special_tokens={"<|bos|>": 256})
    tok = pd.Tokenizer(enc, bos_id=256)
    task = ev.TASKS["copa"]
    item = {"query": "q", "choices": ["\u00e9t\u00e9", "\u00e8re"], "gold": 0}
    rows = ev.encode(task, ev.render(task, item, []), tok, 99)
    assert [bytes(r[0][r[1]:r[1] + 1]) for r in rows] == [b"\xa9", b"\xa8"]  # the spans start mid-character
    assert [ev.per_byte(12.0, row, tok) for row in rows] == [3.0, 4.0]


def test_a_choice_that_prefixes_another_still_scores_a_token():
    """ "ab" is all shared prefix of "abc": its span would be empty (loss 0, always the winner); the common
    start moves back one token for every choice instead."""
    rows = ev.encode(ev.TASKS["arc_easy"], ["ab", "abc"], CharTokenizer(), 100)
    assert [(s, e) for _, s, e in rows] == [(2, 3), (2, 4)]  # after <|bos|> a: "b" and "bc"
    rows = ev.encode(ev.TASKS["arc_easy"], ["abc", "ab"], CharTokenizer(), 100)  # the short one last: the same
    assert [(s, e) for _, s, e in rows] == [(2, 4), (2, 3)]
    assert ev.per_byte(6.0, rows[0], CharTokenizer()) == 3.0  # over the scored span's 2 bytes ("bc"), not from start on
    assert ev.per_byte(6.0, (rows[0][0], 1, 3), CharTokenizer()) == 3.0  # "ab" of "abc": the span's end counts
    # an lm item with nothing to predict is refused when its task file is read
    assert ev.item_problem("lm", {"context": "c", "continuation": " "}) == \
        "an lm item needs a continuation to predict, not an empty one"


def test_scored_spans_of_each_kind():
    tok = CharTokenizer()
    text = lambda row: "".join(map(chr, row[0][row[1]:row[2]]))
    mc = ev.encode(ev.TASKS["arc_easy"], ["Q\nAnswer: abc", "Q\nAnswer: abd", "Q\nAnswer: x"], tok, 99)
    assert [text(r) for r in mc] == ["abc", "abd", "x"]  # after the prefix all choices share
    schema = ev.encode(ev.TASKS["winograd"], ["he ran! yz", "she sat. yz"], tok, 99)
    assert [text(r) for r in schema] == [" yz", " yz"]
    (lm,) = ev.encode(ev.TASKS["squad"], ["ctx", "ctx abc"], tok, 99)
    assert text(lm) == " abc" and lm[0][0] == 0  # bos first
    for row in mc + schema + [lm]:
        assert row[0][0] == tok.bos_id
    # with BPE the continuation's first token may merge with the prompt's last: "Answer:" + " 42" becomes
    # "Answer", ": 4", "2" here, and the scored span starts where the two encodings part, at ": 4"
    ranks = {bytes([i]): i for i in range(256)} | {b": ": 256, b": 4": 257}
    bpe = tiktoken.Encoding("merge", pat_str=r"[\s\S]+", mergeable_ranks=ranks, special_tokens={"<|bos|>": 258})
    merging = SimpleNamespace(bos_id=258, encode=bpe.encode_ordinary)
    (lm,) = ev.encode(ev.TASKS["squad"], ["Answer:", "Answer: 42"], merging, 99)
    assert [bpe.decode([t]) for t in lm[0][lm[1]:lm[2]]] == [": 4", "2"]


def test_language_modeling_needs_every_token():
    task = ev.TASKS["lambada_openai"]
    model = RuleModel()
    for cont, right in (("abcd", True), ("abd", False), ("zz", False), ("a", True)):
        rows = ev.encode(task, ev.render(task, {"context": "x.", "continuation": cont}, []), CharTokenizer(), 99)
        assert ev.score(model, rows, 1, "cpu", 0)[1] == [right]


def test_long_prompts_are_cropped_from_the_left_keeping_the_continuation(tmp_path):
    items = fixture_items("squad", 30, seed=3)  # 10-shot prompts of ~250 characters
    bundle = write_bundle(tmp_path, {"squad": items})
    model = RuleModel(block_size=40)
    res = ev.evaluate_core(model, CharTokenizer(), bundle, tasks=["squad"], batch_size=4)
    assert res["tasks"]["squad"]["accuracy"] == pytest.approx(expected_accuracy(items))
    assert max(b.size(1) for b in model.seen) == 40  # cropped, and to exactly the block size
    # a continuation longer than the block: its last block_size - 1 tokens are scored
    task = ev.TASKS["lambada_openai"]
    cont = "abcdefghijklmnopqrstuvwxy"
    (row,) = ev.encode(task, ev.render(task, {"context": "x.", "continuation": cont}, []), CharTokenizer(), 10)
    assert len(row[0]) == 10 and row[1:] == (1, 10) and bytes(row[0]).decode() == cont[-10:]
    assert ev.score(RuleModel(block_size=10), [row], 1, "cpu", 0)[1] == [True]


def test_uncropped_prompts_start_with_bos(tmp_path):
    bundle = write_bundle(tmp_path, {"copa": fixture_items("copa", 10)})
    model = RuleModel()
    ev.evaluate_core(model, CharTokenizer(), bundle, tasks=["copa"], batch_size=1)
    assert len(model.seen) == sum(len(it["choices"]) for it in fixture_items("copa", 10))
    assert all(b[0, 0].item() == 0 for b in model.seen)


def tiny_gpt(vocab_size, block_size, seed=0):
    torch.manual_seed(seed)
    model = GPT(GPTConfig.preset("cpu", "bov", n_layer=2, n_embd=48, n_head=4, vocab_size=vocab_size, block_size=block_size))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # random weights everywhere, so that options differ clearly
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 1 / math.sqrt(p.size(1)), generator=g)
    return model.eval()


def test_batched_scores_equal_one_sequence_at_a_time():
    """Padding, sorting by length and masking change nothing: each row's summed loss and greedy
    match equal those of an unpadded forward pass with the model's own per-token losses."""
    model, tok = tiny_gpt(128, 64), CharTokenizer()
    rows = []
    for label, n in (("arc_easy", 3), ("winograd", 2), ("squad", 3), ("jeopardy", 2), ("copa", 3)):
        items = fixture_items(label, n, seed=1)
        for i in range(n):
            shots = [items[j] for j in ev.fewshot_indices(n, i, ev.TASKS[label].shots)]
            rows += ev.encode(ev.TASKS[label], ev.render(ev.TASKS[label], items[i], shots), tok, 64)
    for text in ("story", "question 12"):  # continuations the model gets right: its own greedy tokens
        prompt = [tok.bos_id] + tok.encode(text)
        rows.append((model.generate(torch.tensor([prompt]), 3, temperature=0)[0].tolist(), len(prompt), len(prompt) + 3))
    assert len({len(t) for t, _, _ in rows}) > 5 and max(len(t) for t, _, _ in rows) == 64  # some cropped
    losses, right = ev.score(model, rows, 5, "cpu", tok.bos_id)
    for (t, s, e), loss, ok in zip(rows, losses, right):
        idx = torch.tensor([t])
        targets = torch.full_like(idx, -1)
        targets[0, s - 1:e - 1] = idx[0, s:e]
        logits, per_token = model(idx, targets, reduction="none")
        assert loss == pytest.approx(per_token.sum().item(), rel=1e-5)
        assert ok == torch.equal(logits[0, s - 1:e - 1].argmax(-1), idx[0, s:e])
    assert right[-2:] == [True, True] and not all(right)


# ---------------------------------------------------------------------------- few-shot prompts

def test_fewshot_draws_are_seeded_distinct_and_never_the_item():
    for n, k in ((2, 10), (11, 10), (50, 10), (86, 10), (500, 10), (300, 3), (5000, 25)):
        for i in (0, 1, n // 2, n - 1):
            got = ev.fewshot_indices(n, i, k)
            assert got == ev.fewshot_indices(n, i, k)  # same seed, same draw
            assert i not in got and len(set(got)) == len(got) == min(k, n - 1) and all(0 <= j < n for j in got)
            # the same draw as sampling from the explicit list of the other items
            assert got == random.Random(1234 + i).sample([j for j in range(n) if j != i], min(k, n - 1))
    assert ev.fewshot_indices(500, 3, 10) != ev.fewshot_indices(500, 4, 10)


def prompts_of(label, items):
    return [ev.render(ev.TASKS[label], items[i], [items[j] for j in ev.fewshot_indices(len(items), i, ev.TASKS[label].shots)])
            for i in range(len(items))]


@pytest.mark.parametrize("label", ["arc_easy", "squad", "jeopardy", "agi_eval_lsat_ar"])
def test_fewshot_prompts_hold_k_solved_other_items(label):
    items = fixture_items(label, 30, seed=5)
    task = ev.TASKS[label]
    prompts = prompts_of(label, items)
    assert prompts == prompts_of(label, items)
    for i, options in enumerate(prompts):
        blocks = options[-1].split("\n\n")
        assert len(blocks) == task.shots + 1
        assert int(blocks[-1].split()[1]) == i  # "question 7 ..." or "story 7 is long."
        for b in blocks[:-1]:  # each example is another item, solved: its gold answer follows the delimiter
            n = int(b.split()[1])
            assert n != i
            answer = items[n]["choices"][items[n]["gold"]] if task.kind == "mc" else items[n]["continuation"]
            assert b.endswith(task.delimiter + answer)


def test_render_formats():
    mc = ev.Task("x", "mc", 1, "\nAnswer: ")
    shot = {"query": "Q1", "choices": ["no", "yes"], "gold": 1}
    assert ev.render(mc, {"query": "Q2", "choices": ["a", "b"]}, [shot]) == \
        ["Q1\nAnswer: yes\n\nQ2\nAnswer: a", "Q1\nAnswer: yes\n\nQ2\nAnswer: b"]
    schema = ev.Task("x", "schema", 1, " ")
    shot = {"context_options": ["A1", "B1"], "continuation": "c1", "gold": 0}
    assert ev.render(schema, {"context_options": ["A2", "B2"], "continuation": "c2"}, [shot]) == \
        ["A1 c1\n\nA2 c2", "A1 c1\n\nB2 c2"]
    schema = ev.Task("x", "schema", 0, "\nAnswer: ")  # the task's delimiter, not a space, joins option and continuation
    assert ev.render(schema, {"context_options": ["A2", "B2"], "continuation": "c2"}, []) == \
        ["A2\nAnswer: c2", "B2\nAnswer: c2"]
    lm = ev.Task("x", "lm", 1, "\nAnswer: ")
    shot = {"context": "  Q1 ", "continuation": "a1"}
    assert ev.render(lm, {"context": "Q2  ", "continuation": "a2"}, [shot]) == ["Q1\nAnswer: a1\n\nQ2\nAnswer:", "Q1\nAnswer: a1\n\nQ2\nAnswer: a2"]


def test_the_21_tasks_of_the_paper():
    assert len(ev.TASKS) == 21
    kinds = {k: sorted(t for t in ev.TASKS if ev.TASKS[t].kind == k) for k in ("mc", "schema", "lm")}
    assert kinds["schema"] == ["winograd", "winogrande"]
    assert len(kinds["mc"]) == 10 and len(kinds["lm"]) == 9
    assert {t: ev.TASKS[t].shots for t in ev.TASKS} == {  # nanochat's core.yaml, every task
        "jeopardy": 10, "bigbench_qa_wikidata": 10, "arc_easy": 25, "arc_challenge": 25, "copa": 0, "commonsense_qa": 10,
        "piqa": 10, "openbook_qa": 0, "lambada_openai": 0, "hellaswag": 10, "winograd": 0, "winogrande": 5,
        "bigbench_dyck_languages": 10, "agi_eval_lsat_ar": 3, "bigbench_cs_algorithms": 10, "bigbench_operators": 10,
        "bigbench_repeat_copy_logic": 10, "squad": 10, "coqa": 0, "boolq": 10, "bigbench_language_identification": 10}
    assert {t for t in ev.TASKS if ev.TASKS[t].delimiter != " "} == {"jeopardy", "arc_easy", "arc_challenge", "piqa", "boolq"}


# ---------------------------------------------------------------------------- centered accuracy and CORE

def test_centered_accuracy_and_core(tmp_path):
    tasks = {"copa": fixture_items("copa", 40, 1), "winograd": fixture_items("winograd", 30, 2),
             "squad": fixture_items("squad", 25, 3), "arc_challenge": fixture_items("arc_challenge", 20, 4)}
    baselines = {"copa": 50, "winograd": 60, "squad": 0, "arc_challenge": 25}
    bundle = write_bundle(tmp_path, tasks, baselines)
    res = ev.evaluate_core(RuleModel(), CharTokenizer(), bundle, tasks=list(tasks), batch_size=16)
    centered = []
    for label, items in tasks.items():
        acc, r = expected_accuracy(items), baselines[label] / 100
        got = res["tasks"][label]
        assert got["accuracy"] == pytest.approx(acc) and got["random_baseline"] == pytest.approx(r)
        assert got["centered"] == pytest.approx((acc - r) / (1 - r))
        centered.append((acc - r) / (1 - r))
    assert res["core"] == pytest.approx(sum(centered) / 4)
    assert min(centered) < 0 < max(centered)  # below chance centers below zero
    table = ev.format_table(res)
    assert "CORE (4 of 21 tasks)" in table and f"{res['core']:+.4f}" in table.splitlines()[-1]


def test_the_model_leaves_in_the_mode_it_came_in(tmp_path):
    bundle = write_bundle(tmp_path, {"copa": fixture_items("copa", 4)})
    for training in (False, True):
        model = RuleModel().train(training)
        ev.evaluate_core(model, CharTokenizer(), bundle, tasks=["copa"])
        assert model.training == training


def test_max_per_task_takes_the_first_items_of_a_fixed_shuffle(tmp_path):
    items = fixture_items("copa", 60, 9)
    bundle = write_bundle(tmp_path, {"copa": items})
    accs = set()
    for n in (7, 13, 60, 500):
        res = ev.evaluate_core(RuleModel(), CharTokenizer(), bundle, tasks=["copa"], max_per_task=n)
        assert res["tasks"]["copa"]["items"] == min(n, 60) and res["max_per_task"] == n
        assert res["tasks"]["copa"]["accuracy"] == pytest.approx(expected_accuracy(items, n))
        accs.add(res["tasks"]["copa"]["accuracy"])
    assert len(accs) > 1


# ---------------------------------------------------------------------------- bad input

def test_bad_tasks_bundles_and_items_are_one_line_errors(tmp_path):
    model, tok = RuleModel(), CharTokenizer()
    bundle = write_bundle(tmp_path, {"copa": fixture_items("copa", 3)})
    cases = [
        (dict(tasks=["copa", "mmlu"]), "unknown task(s) mmlu"),
        (dict(tasks=["xyz", "arc_esay"]), "unknown task(s) xyz, arc_esay (did you mean arc_easy?); the tasks are jeopardy"),
        (dict(tasks=["copa", "winograd"]), "eval_data lacks language_understanding/winograd_wsc.jsonl"),
        (dict(tasks=["copa"], max_per_task=0), "max_per_task"),
    ]
    for kw, msg in cases:
        with pytest.raises(ev.EvalError, match=re.escape(msg)):
            ev.evaluate_core(model, tok, bundle, **kw)
    with pytest.raises(ev.EvalError, match="has no eval_meta_data.csv"):
        ev.evaluate_core(model, tok, str(tmp_path / "eval_bundle" / "eval_data"), tasks=["copa"])
    path = tmp_path / "eval_bundle" / "eval_data" / ev.TASKS["copa"].path
    for line, msg in (('{"query": "q", "choices": ["a"], "gold": 3}', "copa.jsonl:2: gold 3"),
                      ('{"query": "q", "gold": 0}', "copa.jsonl:2: a mc item needs the fields query, choices, gold"),
                      ('{"query": "q", "choices": ["a", 7], "gold": 0}', "copa.jsonl:2: the fields .* must be text"),
                      ('{"query": ', "copa.jsonl:2: not JSON")):
        path.write_text(json.dumps(fixture_items("copa", 1)[0]) + "\n" + line + "\n")
        with pytest.raises(ev.EvalError, match=msg) as e:
            ev.evaluate_core(model, tok, bundle, tasks=["copa"])
        assert "\n" not in str(e.value)
    path.write_text(json.dumps(fixture_items("copa", 1)[0]) + "\n" + '{"query": "q", "choices": ["a"], "gold": true}\n')
    with pytest.raises(ev.EvalError, match="copa.jsonl:2: gold True is not an index"):
        ev.evaluate_core(model, tok, bundle, tasks=["copa"])
    path.write_bytes('{"query": "café", "choices": ["a"], "gold": 0}\n'.encode("latin-1"))
    with pytest.raises(ev.EvalError, match=f"^{path} is not UTF-8 text"):
        ev.evaluate_core(model, tok, bundle, tasks=["copa"])
    good = (json.dumps(fixture_items("copa", 1)[0]) + "\n").encode()
    path.write_bytes(good * 2000 + b"\xff\n")  # past the reader's first buffer: the offset is the file's
    with pytest.raises(ev.EvalError) as e:
        ev.evaluate_core(model, tok, bundle, tasks=["copa"])
    assert str(e.value) == f"{path} is not UTF-8 text (byte 0xff at offset {2000 * len(good)})"
    # a bad file of a later task is found before any task is scored
    write_bundle(tmp_path, {"copa": fixture_items("copa", 3), "boolq": fixture_items("boolq", 3)})
    boolq = tmp_path / "eval_bundle" / "eval_data" / ev.TASKS["boolq"].path
    boolq.write_text(boolq.read_text() + "{oops\n")
    model.seen.clear()
    with pytest.raises(ev.EvalError, match="boolq.jsonl:4: not JSON"):
        ev.evaluate_core(model, tok, bundle, tasks=["copa", "boolq"])
    assert model.seen == []
    write_bundle(tmp_path, {"copa": fixture_items("copa", 3)}, baselines={"winograd": 50})
    with pytest.raises(ev.EvalError, match="no random baseline for copa"):
        ev.evaluate_core(model, tok, bundle, tasks=["copa"])
    write_bundle(tmp_path, {"copa": fixture_items("copa", 3)}, baselines={"copa": 100})  # 1 - r would be 0
    with pytest.raises(ev.EvalError, match=r"the random baseline of copa is 100%, not in \[0, 100\)"):
        ev.evaluate_core(model, tok, bundle, tasks=["copa"])
    write_bundle(tmp_path, {"copa": fixture_items("copa", 3)})
    assert list(ev.evaluate_core(model, tok, bundle, tasks=["copa", "copa"])["tasks"]) == ["copa"]  # once
    meta = tmp_path / "eval_bundle" / "eval_meta_data.csv"  # saved by a spreadsheet, with a byte-order mark
    meta.write_bytes(b"\xef\xbb\xbf" + meta.read_bytes())
    assert list(ev.evaluate_core(model, tok, bundle, tasks=["copa"])["tasks"]) == ["copa"]


def test_bundle_may_be_given_as_the_folder_above_it(tmp_path):
    bundle = write_bundle(tmp_path, {"copa": fixture_items("copa", 3)})
    assert ev.get_bundle(str(tmp_path)) == bundle == ev.get_bundle(bundle)


# ---------------------------------------------------------------------------- download and cache

def serve(directory):
    """A loopback HTTP server for directory in a thread; returns (server, base URL, request log)."""
    log = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(directory), **kw)

        def log_message(self, *a):
            log.append(self.path)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}", log


def closed_port_url():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/eval_bundle.zip"


def test_download_once_into_the_cache(tmp_path, monkeypatch, capsys):
    bundle = write_bundle(tmp_path / "src", {"copa": fixture_items("copa", 5)})
    (tmp_path / "www").mkdir()
    with zipfile.ZipFile(tmp_path / "www" / "eval_bundle.zip", "w") as z:
        for root, _, files in os.walk(bundle):
            for f in files:
                z.write(os.path.join(root, f), os.path.relpath(os.path.join(root, f), tmp_path / "src"))
    (tmp_path / "www" / "broken.zip").write_bytes(b"PK\x03\x04 not really a zip")
    with zipfile.ZipFile(tmp_path / "corrupt.zip", "w", zipfile.ZIP_DEFLATED) as z:  # a deflate stream that is not one
        z.writestr("eval_bundle/eval_data/x.jsonl", "{}\n" * 1000)
        info = z.infolist()[0]
    data = bytearray((tmp_path / "corrupt.zip").read_bytes())
    data[info.header_offset + 30 + len(info.filename.encode()) + len(info.extra)] = 0xFF  # block type 3: reserved
    (tmp_path / "www" / "corrupt.zip").write_bytes(bytes(data))
    server, url, log = serve(tmp_path / "www")
    # the work folders of earlier downloads: one whose process was killed (SIGKILL: no cleanup ran) is removed by
    # the next download; a live process's and another machine's (a shared home folder) stay
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    leftovers = {f".eval_bundle.{pid}@{host}.x": kept for pid, host, kept in (
        (gone.pid, socket.gethostname(), False), (os.getpid(), socket.gethostname(), True), (gone.pid, "elsewhere", True))}
    for name in leftovers:
        (tmp_path / "cache" / "bov" / name).mkdir(parents=True)
        (tmp_path / "cache" / "bov" / name / "eval_bundle.zip").write_bytes(b"part of a zip")
    try:
        monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
        monkeypatch.setenv("BOV_EVAL_BUNDLE_URL", f"{url}/broken.zip")
        with pytest.raises(ev.EvalError, match="could not download and unzip"):
            ev.get_bundle()
        assert sorted(os.listdir(tmp_path / "cache" / "bov")) == sorted(n for n, kept in leftovers.items() if kept)
        for name in leftovers:
            shutil.rmtree(tmp_path / "cache" / "bov" / name, ignore_errors=True)
        for name in ("broken.zip", "corrupt.zip"):
            monkeypatch.setenv("BOV_EVAL_BUNDLE_URL", f"{url}/{name}")
            with pytest.raises(ev.EvalError, match="could not download and unzip"):
                ev.get_bundle()
            assert os.listdir(tmp_path / "cache" / "bov") == []  # nothing half-made is left
        monkeypatch.setenv("BOV_EVAL_BUNDLE_URL", url + "/eval_bundle.zip")
        capsys.readouterr()
        path = ev.get_bundle()
        said = capsys.readouterr()
        assert said.out == "" and f"eval bundle ready in {path}" in said.err  # stdout is the results table's
        assert path == str(tmp_path / "cache" / "bov" / "eval_bundle") and sorted(os.listdir(tmp_path / "cache" / "bov")) == ["eval_bundle"]
        res = ev.evaluate_core(RuleModel(), CharTokenizer(), None, tasks=["copa"])
        assert res["bundle"] == path and res["tasks"]["copa"]["items"] == 5
        assert log == ["/broken.zip", "/broken.zip", "/corrupt.zip", "/eval_bundle.zip"]  # the second use read the cache
        os.remove(os.path.join(path, "eval_meta_data.csv"))  # a damaged cache is reported, not papered over
        with pytest.raises(ev.EvalError, match=f"has no eval_meta_data.csv; delete {path} to download the bundle again"):
            ev.get_bundle()
    finally:
        server.shutdown()


def test_a_flat_zip_is_unpacked_and_a_failed_move_into_the_cache_is_an_error_unless_a_bundle_is_there(tmp_path, monkeypatch):
    """A zip with the bundle's files at its root (a mirror zipped from inside the folder) is taken as nanochat's
    eval_bundle/ is (mutant E25: only eval_bundle/ looked for). The last step renames the unpacked bundle into the
    cache: if that fails with no bundle there, one EvalError naming the cache (mutant E24: swallowed); if another
    download has just put a whole bundle there, that one is used (mutant E24b: an error in both cases)."""
    src = write_bundle(tmp_path / "src", {"copa": fixture_items("copa", 5)})
    (tmp_path / "www").mkdir()
    with zipfile.ZipFile(tmp_path / "www" / "flat.zip", "w") as z:
        for root, _, files in os.walk(src):
            for f in files:
                z.write(os.path.join(root, f), os.path.relpath(os.path.join(root, f), src))
    server, url, _ = serve(tmp_path / "www")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BOV_EVAL_BUNDLE_URL", f"{url}/flat.zip")
    cache, dest = tmp_path / "cache" / "bov", str(tmp_path / "cache" / "bov" / "eval_bundle")
    rename = os.rename
    try:
        def refused(a, b):
            raise PermissionError(13, "Permission denied", b)
        monkeypatch.setattr(os, "rename", refused)
        with pytest.raises(ev.EvalError, match=f"^could not move the bundle to {re.escape(dest)}: "):
            ev.get_bundle()
        assert os.listdir(cache) == []  # nothing half-made is left

        def raced(a, b):  # another download's rename lands first: ours finds the folder there, not empty
            shutil.copytree(src, b)
            raise OSError(39, "Directory not empty", b)
        monkeypatch.setattr(os, "rename", raced)
        assert ev.get_bundle() == dest and os.listdir(cache) == ["eval_bundle"]
        shutil.rmtree(dest)
        monkeypatch.setattr(os, "rename", rename)
        assert ev.get_bundle() == dest and os.listdir(cache) == ["eval_bundle"]
        assert sorted(os.listdir(dest)) == ["eval_data", "eval_meta_data.csv"]
    finally:
        server.shutdown()


def test_a_bundle_behind_a_proxy_is_reachable_through_the_proxy(tmp_path, monkeypatch):
    """urlopen goes through $https_proxy; the reachability check must ask the proxy, not the (unresolvable) host,
    and name the proxy when it is the one that is down."""
    with socket.socket() as proxy:
        proxy.bind(("127.0.0.1", 0))
        proxy.listen()
        port = proxy.getsockname()[1]
        monkeypatch.setattr(ev.urllib.request, "getproxies", lambda: {"https": f"http://127.0.0.1:{port}"})
        assert ev.url_reachable("https://bundle.example.invalid/eval_bundle.zip", timeout=2)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("BOV_EVAL_BUNDLE_URL", "https://bundle.example.invalid/eval_bundle.zip")
    with pytest.raises(ev.EvalError, match=rf" and bundle.example.invalid:443 via proxy 127.0.0.1:{port} is unreachable; "):
        ev.get_bundle()  # the proxy is down
    monkeypatch.setattr(ev.urllib.request, "getproxies", lambda: {})
    assert not ev.url_reachable("https://bundle.example.invalid/eval_bundle.zip", timeout=2)


def empty_zip(path):
    """A stand-in checkpoint for runs whose loading is stubbed out: a whole zip with a data.pkl, as torch.save
    writes, though an empty one."""
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", b"")


def a_run_that_loads_nothing(tmp_path, monkeypatch):
    """(bundle, ckpt) for ev.main: a one-task bundle and an empty ckpt.pt whose loading is stubbed out."""
    bundle = write_bundle(tmp_path / "b", {"copa": fixture_items("copa", 5)})
    ckpt = tmp_path / "run" / "ckpt.pt"
    ckpt.parent.mkdir()
    empty_zip(ckpt)
    model = type("M", (), {"config": type("C", (), {"vocab_size": 128})})()
    monkeypatch.setattr(ev.GPT, "from_checkpoint", classmethod(lambda cls, *a: (model, {})))
    monkeypatch.setattr(ev, "checkpoint_tokenizer", lambda *a: None)
    monkeypatch.setattr(ev, "load_bundle", lambda path, tasks: (path, tasks, {}, {}))  # stubbed: the one-task bundle would fail the all-21 check
    return bundle, ckpt


def test_the_cli_reads_every_task_file_before_it_loads_the_model(tmp_path, monkeypatch):
    """Mutant (main): the bundle's folder alone checked first, its task files only by evaluate_core, after
    the model and tokenizer have loaded (minutes for a large checkpoint on a GPU)."""
    bundle = write_bundle(tmp_path / "b", {"copa": fixture_items("copa", 3)})
    path = tmp_path / "b" / "eval_bundle" / "eval_data" / ev.TASKS["copa"].path
    path.write_text(path.read_text() + "{oops\n")
    ckpt = tmp_path / "run" / "ckpt.pt"
    ckpt.parent.mkdir()
    empty_zip(ckpt)
    monkeypatch.setattr(ev.GPT, "from_checkpoint", classmethod(lambda cls, *a: pytest.fail("the model was loaded")))
    for tasks, msg in (("copa", "copa.jsonl:4: not JSON"), ("copa,boolq", "eval_data lacks reading_comprehension/boolq.jsonl")):
        with pytest.raises(SystemExit) as e:
            ev.main(["--ckpt", str(ckpt), "--device", "cpu", "--bundle", bundle, "--tasks", tasks])
        assert e.value.code.startswith("eval.py: error: ") and msg in e.value.code


def test_host_out_of_memory_names_batch_size(tmp_path, monkeypatch):
    """The host allocator's RuntimeError, not only CUDA's OutOfMemoryError, gets the --batch_size hint."""
    bundle, ckpt = a_run_that_loads_nothing(tmp_path, monkeypatch)

    for error in (RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
                               "you tried to allocate 68719476736 bytes. Error code 12 (Cannot allocate memory)"),
                  MemoryError("Unable to allocate 64.0 GiB for an array")):  # Python's or numpy's
        def oom(*a, **k):
            raise error
        monkeypatch.setattr(ev, "evaluate_core", oom)
        with pytest.raises(SystemExit) as e:
            ev.main(["--ckpt", str(ckpt), "--device", "cpu", "--bundle", str(bundle), "--batch_size", "4"])
        assert e.value.code == "eval.py: error: out of memory on cpu; lower --batch_size (now 4)"


def test_dtype_sets_the_autocast_of_the_forward(tmp_path, monkeypatch):
    """--dtype reaches the model's forward as the autocast dtype (auto is float32 on a CPU: no autocast);
    the scores under bfloat16 stay the rule model's (its logits are exact in bf16)."""
    class Recording(RuleModel):
        def forward(self, idx):
            self.modes.append(torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32)
            return super().forward(idx)
    items = fixture_items("copa", 6)
    bundle = write_bundle(tmp_path / "direct", {"copa": items})
    for dtype, expect in ((None, torch.float32), (torch.bfloat16, torch.bfloat16), (torch.float32, torch.float32)):
        model = Recording()
        model.modes = []
        res = ev.evaluate_core(model, CharTokenizer(), bundle, tasks=["copa"], dtype=dtype)
        assert set(model.modes) == {expect} and res["tasks"]["copa"]["accuracy"] == expected_accuracy(items)
    seen = []  # auto on CUDA, without a GPU: bf16 where the GPU has it, else fp16
    monkeypatch.setattr(ev, "evaluate_task", lambda *a, **k: (seen.append(a[-1]), 1.0)[1])
    monkeypatch.setattr(torch.version, "hip", None)  # a CUDA build's answer (ROCm's is bf16 on every GPU)
    for major in (8, 7):  # an A100, a V100
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (major, 0))
        ev.evaluate_core(Recording(), CharTokenizer(), bundle, tasks=["copa"], device="cuda")
    assert seen == [torch.bfloat16, torch.float16]
    monkeypatch.undo()
    bundle, ckpt = a_run_that_loads_nothing(tmp_path, monkeypatch)  # the CLI passes --dtype on
    seen = []
    monkeypatch.setattr(ev, "evaluate_core", lambda *a, dtype=None, **k: (seen.append(dtype), {"core": 0.0, "tasks": {},
                                                                        "max_per_task": None, "bundle": bundle})[1])
    for flag in (["--dtype", "bfloat16"], [], ["--dtype", "float16"]):
        ev.main(["--ckpt", str(ckpt), "--device", "cpu", "--bundle", str(bundle), *flag])
    assert seen == [torch.bfloat16, torch.float32, torch.float16]


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, monkeypatch, capsys):
    bundle, ckpt = a_run_that_loads_nothing(tmp_path, monkeypatch)

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt
    for where in ("evaluate_core", "unreadable_checkpoint", "no_checkpoint"):  # in the evaluation, or in the first checks
        monkeypatch.setattr(ev, where, ctrl_c)
        with pytest.raises(SystemExit) as e:
            ev.main(["--ckpt", str(ckpt if where != "no_checkpoint" else tmp_path / "none.pt"), "--device", "cpu",
                     "--bundle", str(bundle)])
        assert e.value.code == 130 and capsys.readouterr().err.splitlines() == ["eval.py: interrupted"]
        assert os.listdir(ckpt.parent) == ["ckpt.pt"]  # no results file


def test_a_run_folder_is_read_as_its_ckpt_pt(tmp_path, monkeypatch):
    """--ckpt may name the run's folder (nanoGPT's --out_dir habit): its ckpt.pt is loaded, not refused as a folder."""
    bundle = write_bundle(tmp_path / "b", {"copa": fixture_items("copa", 5)})
    run = tmp_path / "run"
    run.mkdir()
    empty_zip(run / "ckpt.pt")
    loaded = []
    model = type("M", (), {"config": type("C", (), {"vocab_size": 128})})()
    monkeypatch.setattr(ev.GPT, "from_checkpoint", classmethod(lambda cls, path, *a: loaded.append(path) or (model, {})))
    monkeypatch.setattr(ev, "checkpoint_tokenizer", lambda *a: None)
    monkeypatch.setattr(ev, "evaluate_core", lambda *a, **k: (_ for _ in ()).throw(ValueError("stop here")))
    with pytest.raises(SystemExit) as e:
        ev.main(["--ckpt", str(run), "--device", "cpu", "--bundle", str(bundle), "--tasks", "copa"])
    assert e.value.code == "eval.py: error: stop here" and loaded == [str(run / "ckpt.pt")]


def test_sigterm_during_the_download_leaves_no_partial_file(tmp_path):
    """A job timeout's SIGTERM runs the download's cleanup (exit 143), like Ctrl-C, instead of killing it midway."""
    with socket.socket() as srv:  # an HTTP server that sends a header and a few bytes, then stalls
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        def stall():
            try:
                while True:  # the first connection is eval.py's reachability check
                    conn, _ = srv.accept()
                    if conn.recv(4096):
                        conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: 1000000\r\n\r\n" + b"PK" * 100)
                        time.sleep(30)
                    conn.close()
            except OSError:  # the test is over and closed the server
                pass
        threading.Thread(target=stall, daemon=True).start()
        empty_zip(tmp_path / "ckpt.pt")  # not read before the bundle
        env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"),
                   BOV_EVAL_BUNDLE_URL=f"http://127.0.0.1:{srv.getsockname()[1]}/eval_bundle.zip")
        p = subprocess.Popen([sys.executable, os.path.join(HERE, "eval.py"), "--ckpt", str(tmp_path / "ckpt.pt"),
                              "--device", "cpu"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        cache = tmp_path / "cache" / "bov"
        t0 = time.time()
        while not any(cache.glob(".eval_bundle*/eval_bundle.zip")) and time.time() - t0 < 60:
            time.sleep(0.1)
        assert any(cache.glob(".eval_bundle*/eval_bundle.zip"))
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    assert p.returncode == 143 and os.listdir(cache) == []


def test_an_empty_task_list_is_refused(tmp_path):
    empty_zip(tmp_path / "ckpt.pt")
    with pytest.raises(SystemExit, match=r"^eval.py: error: --tasks names no task; the tasks are jeopardy, .* \(leave --tasks out for all\)$"):
        ev.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--tasks", ""])  # not all 21 tasks, as when --tasks is left out
    assert not (tmp_path / "core_eval.json").exists()


def test_two_runs_on_one_checkpoint_write_through_their_own_temporary_files(tmp_path, monkeypatch):
    ckpt = tmp_path / "ckpt.pt"
    empty_zip(ckpt)
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=128))
    monkeypatch.setattr(ev, "load_bundle", lambda path, tasks: ("bundle", tasks, {}, {}))
    monkeypatch.setattr(ev, "GPT", SimpleNamespace(from_checkpoint=lambda *a: (model, {})))
    monkeypatch.setattr(ev, "checkpoint_tokenizer", lambda *a: CharTokenizer())
    monkeypatch.setattr(ev, "evaluate_core", lambda *a, **k: {"core": 0.0, "tasks": {}, "max_per_task": None, "bundle": "bundle"})
    temps, write_json = [], ev.write_json
    monkeypatch.setattr(ev, "write_json", lambda path, obj, tmp=None: (temps.append(tmp), write_json(path, obj, tmp)))
    ev.main(["--ckpt", str(ckpt), "--device", "cpu"])
    assert temps == [f"{tmp_path / 'core_eval.json'}.tmp{os.getpid()}"]  # by process id: never another run's
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt", "core_eval.json"]


def run_cli(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, os.path.join(HERE, "eval.py"), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=HERE)


def test_no_bundle_offline_is_one_clear_line_and_fast(tmp_path, monkeypatch, capsys):
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "BOV_EVAL_BUNDLE_URL": closed_port_url()}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    t0 = time.time()
    with pytest.raises(ev.EvalError, match="unreachable.*--bundle"):
        ev.get_bundle()
    assert time.time() - t0 < 6
    for bad in ("notaurl", "file:///tmp/eval_bundle.zip", "http://[::1"):  # the variable is named, not a parser's complaint
        monkeypatch.setenv("BOV_EVAL_BUNDLE_URL", bad)
        with pytest.raises(ev.EvalError) as e:
            ev.get_bundle()
        assert str(e.value) == f"BOV_EVAL_BUNDLE_URL={bad!r} is not an http(s) URL"
    monkeypatch.setenv("BOV_EVAL_BUNDLE_URL", env["BOV_EVAL_BUNDLE_URL"])
    (tmp_path / "a_file").write_text("")  # a cache that cannot be made (here under a file): one line, not a traceback
    monkeypatch.setattr(ev, "url_reachable", lambda url, timeout=None: True)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a_file" / "cache"))
    with pytest.raises(ev.EvalError, match=f"^cannot make the bundle cache {tmp_path / 'a_file' / 'cache' / 'bov'} "
                       r"\(Not a directory\); set XDG_CACHE_HOME to a writable folder, or unzip the bundle anywhere"):
        ev.get_bundle()
    monkeypatch.undo()
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    empty_zip(tmp_path / "ckpt.pt")  # before the bundle the checkpoint is only checked to be a whole zip, not loaded
    capsys.readouterr()  # the bundle is checked before the checkpoint is loaded: the one line eval.py prints, exit 1
    with pytest.raises(SystemExit) as e:  # (in-process: eval.py's own command line is test_cli_end_to_end's and others')
        ev.main(["--ckpt", str(tmp_path / "ckpt.pt")])
    line = e.value.code
    assert isinstance(line, str) and "\n" not in line and line.startswith("eval.py: error:")
    assert "--bundle" in line and "unreachable" in line and capsys.readouterr().err == ""
    assert not os.path.exists(tmp_path / "cache" / "bov" / "eval_bundle")
    with pytest.raises(SystemExit, match=f"^eval.py: error: --bundle: no folder {tmp_path / 'nowhere'}; expected an "
                       r"unzipped eval_bundle \(eval_meta_data.csv and eval_data/\)$"):
        ev.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--bundle", str(tmp_path / "nowhere")])


# ---------------------------------------------------------------------------- end to end

def test_cli_end_to_end_on_a_tiny_real_model(tmp_path, capsys, monkeypatch):
    rng = random.Random(0)
    words = "question story case said it quietly long is abcd the answer yes no a b c".split()
    (tmp_path / "corpus").mkdir()
    with open(tmp_path / "corpus" / "c.jsonl", "w") as f:
        for _ in range(60):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(80))}) + "\n")
    data_dir = tmp_path / "data"
    pd.main(["--source", f"files:{tmp_path}/corpus/*.jsonl", "--out_dir", str(data_dir), "--vocab_size", "300",
             "--val_tokens", "500"])
    bundle = write_bundle(tmp_path, {label: fixture_items(label, 4, seed=k) for k, label in enumerate(ev.TASKS)})
    model = tiny_gpt(300, 64)
    ckpt = tmp_path / "run" / "ckpt.pt"
    model.save_checkpoint(str(ckpt), data_dir=str(data_dir), step=7)  # as train.py's save at step 7
    # a full stdout loses nothing (the file is written first): checked below on a copy of the checkpoint in a
    # folder of its own, in a process started now, alongside the full run (their torch imports overlap)
    on_full_ckpt = tmp_path / "full_stdout" / "ckpt.pt"
    model.save_checkpoint(str(on_full_ckpt), data_dir=str(data_dir))
    with open("/dev/full", "w") as full_stdout:
        on_full = subprocess.Popen([sys.executable, "eval.py", "--ckpt", str(on_full_ckpt), "--bundle", bundle, "--tasks", "copa",
                                    "--max_per_task", "2"], stdout=full_stdout, stderr=subprocess.PIPE, text=True, cwd=HERE)

    r = run_cli("--ckpt", ckpt, "--bundle", bundle, "--batch_size", 8)
    assert r.returncode == 0, r.stderr
    out = json.loads((tmp_path / "run" / "core_eval.json").read_text())
    assert sorted(os.listdir(tmp_path / "run")) == ["ckpt.pt", "core_eval.json"]  # no temporary file left
    assert list(out["tasks"]) == list(ev.TASKS) and out["ckpt"] == str(ckpt) and out["bundle"] == bundle and out["step"] == 7
    assert out["max_per_task"] is None and set(out["tasks"]["copa"]) == {"accuracy", "centered", "random_baseline", "items", "shots", "kind"}
    table = r.stdout.splitlines()
    for label, v in out["tasks"].items():
        assert v["items"] == 4 and v["accuracy"] * 4 == pytest.approx(round(v["accuracy"] * 4))
        assert any(line.startswith(label + " ") and f"{v['centered']:+.4f}" in line for line in table)
    assert out["core"] == pytest.approx(sum(v["centered"] for v in out["tasks"].values()) / 21)
    assert any(line.startswith("CORE ") and f"{out['core']:+.4f}" in line for line in table)

    # the CLI reports what evaluate_core computes in-process; the model's train/eval mode is restored
    loaded, _ = GPT.from_checkpoint(str(ckpt))
    loaded.train()
    res = ev.evaluate_core(loaded, pd.load_tokenizer(str(data_dir)), bundle, batch_size=8)
    assert loaded.training
    assert {k: v["accuracy"] for k, v in res["tasks"].items()} == {k: v["accuracy"] for k, v in out["tasks"].items()}
    with pytest.raises(SystemExit, match=r"^eval.py: error: unknown task\(s\) nope; the tasks are jeopardy, "):
        ev.main(["--ckpt", str(ckpt), "--bundle", bundle, "--tasks", "copa,nope"])
    full = (tmp_path / "run" / "core_eval.json").read_text()
    ev.main(["--ckpt", str(ckpt), "--bundle", bundle, "--tasks", "copa", "--max_per_task", "2"])  # a quick check, in-process
    assert (tmp_path / "run" / "core_eval.json").read_text() == full  # the full result stays
    assert list(json.loads((tmp_path / "run" / "core_eval_partial.json").read_text())["tasks"]) == ["copa"]
    (tmp_path / "run" / "core_eval_partial.json").unlink()
    elsewhere = tmp_path / "results.json"  # --out: for a checkpoint in a folder that cannot be written
    ev.main(["--ckpt", str(ckpt), "--bundle", bundle, "--tasks", "copa", "--max_per_task", "2", "--out", str(elsewhere)])
    assert list(json.loads(elsewhere.read_text())["tasks"]) == ["copa"] and sorted(os.listdir(tmp_path / "run")) == ["ckpt.pt", "core_eval.json"]
    ev.main(["--ckpt", str(ckpt), "--bundle", bundle, "--tasks", "piqa", "--max_per_task", "2", "--out", str(elsewhere)])
    assert list(json.loads(elsewhere.read_text())["tasks"]) == ["piqa"]  # a results file is replaced
    log = tmp_path / "metrics.jsonl"  # any other file is not: a run's log, a tokenizer, a results file's look-alike
    for text in ('{"type": "eval", "step": 2}\n', '{"core": 0.1, "tasks": {}}', "not json"):
        log.write_text(text)
        with pytest.raises(SystemExit):
            ev.main(["--ckpt", str(ckpt), "--bundle", bundle, "--tasks", "copa", "--out", str(log)])
        assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: --out {log} exists and holds no eval.py results; "
                                                                 "remove it or name another file")
        assert log.read_text() == text
    os.mkfifo(tmp_path / "fifo")  # a path that is no regular file is not replaced by the results' rename either
    os.symlink(elsewhere, tmp_path / "link.json")  # (a link to a results file: the link would become a file)
    for special in (tmp_path / "fifo", tmp_path / "link.json"):
        with pytest.raises(SystemExit):
            ev.main(["--ckpt", str(ckpt), "--bundle", bundle, "--tasks", "copa", "--out", str(special)])
        assert capsys.readouterr().err.splitlines()[-1].endswith(
            f"error: {special} is not a regular file (a link, a device, a pipe): the results replace their file whole; "
            "name another file")
    assert stat.S_ISFIFO(os.lstat(tmp_path / "fifo").st_mode) and os.path.islink(tmp_path / "link.json")
    with pytest.raises(SystemExit):
        ev.main(["--ckpt", str(ckpt), "--bundle", bundle, "--out", str(tmp_path / "nowhere" / "r.json")])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: cannot write the results to {tmp_path / 'nowhere' / 'r.json'}: there is no folder {tmp_path / 'nowhere'}")
    (tmp_path / "ro").mkdir()  # a read-only folder (root writes anywhere, so os.access is told)
    access = os.access
    with monkeypatch.context() as m:
        m.setattr(os, "access", lambda path, mode, **k: path != str(tmp_path / "ro") and access(path, mode, **k))
        with pytest.raises(SystemExit):
            ev.main(["--ckpt", str(ckpt), "--bundle", bundle, "--out", str(tmp_path / "ro" / "r.json")])
    assert capsys.readouterr().err.splitlines()[-1].endswith(
        f"error: cannot write the results to {tmp_path / 'ro' / 'r.json'}: {tmp_path / 'ro'} is not writable")
    os.link(ckpt, tmp_path / "hard_link.pt")  # another name for the same file
    for bad, why in (("", "'' is empty"), (str(ckpt), f"{str(ckpt)!r} is the checkpoint itself"),
                     (str(tmp_path / "hard_link.pt"), f"{str(tmp_path / 'hard_link.pt')!r} is the checkpoint itself")):
        with pytest.raises(SystemExit):
            ev.main(["--ckpt", str(tmp_path / "run"), "--bundle", bundle, "--out", bad])
        assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: --out {why}; name a results file")
    GPT.from_checkpoint(str(ckpt))  # still a checkpoint
    truncated = tmp_path / "truncated.pt"  # a copy cut short: refused before the bundle is looked for
    truncated.write_bytes(ckpt.read_bytes()[:-100])
    with pytest.raises(SystemExit, match=rf"^eval.py: error: cannot read checkpoint {truncated}: not a checkpoint train.py "
                       r"wrote, or damaged \(not a complete zip archive\)$"):
        ev.main(["--ckpt", str(truncated), "--bundle", str(tmp_path / "nowhere")])
    flipped = tmp_path / "flipped.pt"  # a bit changed inside a tensor: the early check reads the zip's directory only,
    flipped.write_bytes(ckpt.read_bytes())  # so the bundle is looked for first; the CRC-32s refuse it at the load
    record = flip_tensor_byte(flipped)
    with pytest.raises(SystemExit, match=rf"^eval.py: error: --bundle: no folder {tmp_path / 'nowhere'};"):
        ev.main(["--ckpt", str(flipped), "--bundle", str(tmp_path / "nowhere")])
    with pytest.raises(SystemExit, match=rf"^eval.py: error: cannot read checkpoint {flipped}: .*\(its record {record} fails"):
        ev.main(["--ckpt", str(flipped), "--bundle", bundle, "--tasks", "copa", "--max_per_task", "2"])
    def unreadable(*a, **k):  # as for a user who may not read it (the tests run as root, who may)
        raise PermissionError(13, "Permission denied")
    import model as model_py
    model_py.open = unreadable  # model.py's own open(), not the builtin
    try:
        with pytest.raises(SystemExit, match=rf"^eval.py: error: cannot read checkpoint {ckpt}: Permission denied$"):
            ev.main(["--ckpt", str(ckpt), "--bundle", str(tmp_path / "nowhere")])
    finally:
        del model_py.open
    r = finish(on_full, 120)  # the full stdout: one line naming the file, which holds the results
    partial = tmp_path / "full_stdout" / "core_eval_partial.json"
    assert r.returncode == 1 and r.stderr.strip().splitlines()[-1] == ("eval.py: could not print the table (No space left "
                                                                      f"on device); the results are in {partial}")
    assert "Traceback" not in r.stderr and list(json.loads(partial.read_text())["tasks"]) == ["copa"]
    # the error paths below exit the same way in-process (SystemExit), without a second torch import each
    def refused(*args):
        capsys.readouterr()
        with pytest.raises(SystemExit) as e:
            ev.main(list(map(str, args)))
        out, err = capsys.readouterr()
        assert "CORE" not in out
        return e.value.code, err
    (tmp_path / "run" / "core_eval_partial.json").mkdir()  # the results cannot be written: refused before evaluating
    code, err = refused("--ckpt", ckpt, "--bundle", bundle, "--tasks", "copa")
    assert code == 2 and err.splitlines()[-1].endswith(f"cannot write the results to {tmp_path / 'run' / 'core_eval_partial.json'}: "
                                                       "it is a folder; choose another file with --out")
    (tmp_path / "run" / "core_eval_partial.json").rmdir()
    code, err = refused("--ckpt", tmp_path / "typo.pt", "--bundle", tmp_path / "nowhere")  # the checkpoint is checked first
    assert code == f"eval.py: error: no checkpoint at {tmp_path / 'typo.pt'}; `python train.py` writes one" and err == ""
    (tmp_path / "empty").mkdir()
    code, err = refused("--ckpt", tmp_path / "empty", "--bundle", bundle)  # a folder holds no checkpoint
    assert code == f"eval.py: error: {tmp_path / 'empty'} is a folder with no checkpoint (ckpt.pt) in or below it; " \
                   "`python train.py` writes one" and err == ""
    code, err = refused("--ckpt", ckpt, "--bundle", bundle, "--max_per_task", 0)
    assert code == 2 and "--max_per_task must be at least 1, got 0" in err

    # a checkpoint whose data folder is not here: one line naming --data_dir, which then works
    moved = tmp_path / "moved" / "ckpt.pt"
    model.save_checkpoint(str(moved), data_dir=str(tmp_path / "gone"))
    with pytest.raises(SystemExit) as e:
        ev.main(["--ckpt", str(moved), "--bundle", bundle, "--tasks", "copa"])
    assert e.value.code == f"eval.py: error: {moved} was trained on the data in {tmp_path / 'gone'}, which is not here; pass --data_dir"
    ev.main(["--ckpt", str(moved), "--bundle", bundle, "--tasks", "copa", "--data_dir", str(data_dir), "--batch_size", "8"])
    moved_out = json.loads((tmp_path / "moved" / "core_eval_partial.json").read_text())
    assert moved_out["tasks"]["copa"]["accuracy"] == out["tasks"]["copa"]["accuracy"]

    # train.py --core_eval saves what it prints, as eval.py would for its checkpoint
    # a loaded bundle serves more than one evaluation: the same accuracies each time
    loaded_bundle = ev.load_bundle(bundle)
    with pytest.raises(ValueError, match="^loaded already holds the bundle and its tasks"):  # not silently ignored
        ev.evaluate_core(loaded, pd.load_tokenizer(str(data_dir)), tasks=["copa"], loaded=loaded_bundle)
    for _ in range(2):
        again = ev.evaluate_core(loaded, pd.load_tokenizer(str(data_dir)), batch_size=8, loaded=loaded_bundle)
        assert {k: v["accuracy"] for k, v in again["tasks"].items()} == {k: v["accuracy"] for k, v in out["tasks"].items()}

    # train.py --core_eval saves what it prints, as eval.py would for its checkpoint, reading each task file once
    import train
    reads = []
    monkeypatch.setattr(ev, "load_task", lambda b, label, f=ev.load_task: reads.append(label) or f(b, label))
    run = tmp_path / "trained"
    capsys.readouterr()
    train.main([f"--data_dir={data_dir}", f"--out_dir={run}", "--n_layer=2", "--n_embd=32", "--n_head=2", "--block_size=64",
                "--device_batch_size=4", "--total_batch_tokens=256", "--max_iters=2", "--eval_tokens=128", "--device=cpu",
                "--core_eval", f"--eval_bundle={bundle}"])
    assert sorted(reads) == sorted(ev.TASKS)
    saved = json.loads((run / "core_eval.json").read_text())
    assert f"CORE {saved['core']:.4f}; wrote {run / 'core_eval.json'}" in capsys.readouterr().out
    assert list(saved["tasks"]) == list(ev.TASKS) and saved["ckpt"] == str(run / "ckpt.pt") and saved["step"] == 2


# ---------------------------------------------------------------------------- few-shot prompts, partial runs

def test_a_subset_gives_each_item_the_prompt_of_a_full_run(tmp_path, monkeypatch):
    """Mutant E1 (evaluate_task): few-shot examples drawn from the first n items only (--max_per_task)."""
    seen = []
    score = ev.score
    monkeypatch.setattr(ev, "score", lambda model, rows, *a, **k: (seen.append(list(rows)), score(model, rows, *a, **k))[1])
    data = fixture_items("arc_easy", 40, seed=2)
    ev.evaluate_task(RuleModel(), CharTokenizer(), "arc_easy", data, n=5)
    ev.evaluate_task(RuleModel(), CharTokenizer(), "arc_easy", data)
    subset, full = seen
    assert subset == full[:len(subset)]


def test_schema_shots_show_their_gold_option():
    """Mutant E2 (render, schema): a few-shot example shows context option 0, not the gold one."""
    items = fixture_items("winogrande", 30, seed=5)
    task = ev.TASKS["winogrande"]
    for i, item in enumerate(items):
        shots = [items[j] for j in ev.fewshot_indices(len(items), i, task.shots)]
        for prompt in ev.render(task, item, shots):
            blocks = prompt.split("\n\n")
            assert len(blocks) == task.shots + 1
            for b, s in zip(blocks, shots):
                assert b == f"{s['context_options'][s['gold']]}{task.delimiter}{s['continuation']}"
    assert any(s["gold"] == 1 for s in items)


def test_max_per_task_alone_never_replaces_a_full_result(tmp_path, monkeypatch):
    """Mutant E5 (main): `partial = bool(args.tasks)`, so --max_per_task without --tasks writes core_eval.json."""
    ckpt = tmp_path / "ckpt.pt"
    empty_zip(ckpt)
    (tmp_path / "core_eval.json").write_text("the full result")
    model = SimpleNamespace(config=SimpleNamespace(vocab_size=128))
    monkeypatch.setattr(ev, "load_bundle", lambda path, tasks: ("bundle", tasks, {}, {}))
    monkeypatch.setattr(ev, "GPT", SimpleNamespace(from_checkpoint=lambda *a: (model, {})))
    monkeypatch.setattr(ev, "checkpoint_tokenizer", lambda *a: CharTokenizer())
    monkeypatch.setattr(ev, "evaluate_core", lambda *a, **k: {"core": 0.0, "tasks": {}, "max_per_task": 3, "bundle": "bundle"})
    ev.main(["--ckpt", str(ckpt), "--max_per_task", "3", "--device", "cpu"])
    assert (tmp_path / "core_eval.json").read_text() == "the full result"
    assert json.loads((tmp_path / "core_eval_partial.json").read_text())["max_per_task"] == 3


# ---------------------------------------------------------------------------- scoring and input details

def test_a_one_byte_choice_is_divided_by_its_one_byte():
    """Mutant (per_byte): at least 2 bytes instead of 1. "z" is one wrong token, BAD per byte; "az" is
    (GOOD + BAD) / 2, so "az" wins; halving the one byte's loss would make "z" win (BAD / 2 < (GOOD + BAD) / 2)."""
    task, tok = ev.TASKS["copa"], CharTokenizer()
    item = {"query": "q", "choices": ["z", "az"], "gold": 1}
    rows = ev.encode(task, ev.render(task, item, []), tok, 99)
    assert [ev.per_byte(12.0, row, tok) for row in rows] == [12.0, 6.0]
    assert ev.per_byte(12.0, ([0, 97], 1, 1), tok) == 12.0  # an empty span: divided by 1, not 0
    assert ev.evaluate_task(RuleModel(), tok, "copa", [item]) == 1.0


def test_half_precision_logits_are_scored_in_float32():
    """Mutant (score): the loss taken in the logits' own bf16, where BAD (~10.006) rounds to 10.0 and
    GOOD loses its fourth digit."""
    class Bf16(RuleModel):
        def forward(self, idx):
            logits, _ = super().forward(idx)
            return logits.bfloat16(), None  # 0 and 10: exact in bf16
    task = ev.TASKS["copa"]
    rows = ev.encode(task, ev.render(task, {"query": "q", "choices": ["az", "abc"], "gold": 0}, []), CharTokenizer(), 99)
    losses, right = ev.score(Bf16(), rows, 2, "cpu", 0)
    assert losses == pytest.approx([BAD, 2 * GOOD], rel=1e-6) and right == [False, True]  # after the shared "q a": "z", "bc"


def test_logits_that_are_not_finite_are_refused_not_scored():
    """NaN logits (float16 past its range, a diverged model) would score every choice wrong, and the accuracy with
    them, without a word: refused, naming the dtype, with float16's remedy."""
    class Overflow(RuleModel):
        def forward(self, idx):
            logits, _ = super().forward(idx)
            return logits.masked_fill(idx.unsqueeze(-1) == ord("b"), float("inf")), None
    task = ev.TASKS["copa"]
    rows = ev.encode(task, ev.render(task, {"query": "q", "choices": ["az", "abc"], "gold": 0}, []), CharTokenizer(), 99)
    with pytest.raises(ev.EvalError, match=r"^the model's logits are not finite \(NaN or inf\) under float32$"):
        ev.score(Overflow(), rows, 2, "cpu", 0)
    with pytest.raises(ev.EvalError, match=r"under float16; float16's range is 65504: evaluate with --dtype bfloat16 or float32$"):
        ev.score(Overflow(), rows, 2, "cpu", 0, dtype=torch.float16)
    assert ev.score(RuleModel(), rows, 2, "cpu", 0, dtype=torch.float16)[1] == [False, True]  # finite: scored


def test_meta_data_labels_are_trimmed_and_a_missing_column_is_one_line(tmp_path):
    """Mutants (load_baselines): labels not stripped (" copa " then has no baseline); a negative baseline
    accepted; a KeyError for a missing column escapes as a traceback instead of an EvalError."""
    bundle = write_bundle(tmp_path, {"copa": fixture_items("copa", 3)}, baselines={"copa": 50, "winograd": 60})
    meta = tmp_path / "eval_bundle" / "eval_meta_data.csv"
    meta.write_text(meta.read_text().replace("\ncopa,", "\n copa ,"))
    assert ev.load_baselines(bundle) == {"copa": 0.5, "winograd": 0.6}
    write_bundle(tmp_path, {"copa": fixture_items("copa", 3)}, baselines={"copa": -5})  # (acc + 0.05) / 1.05: not centered
    with pytest.raises(ev.EvalError, match=r"the random baseline of copa is -5%, not in \[0, 100\)$"):
        ev.load_baselines(bundle)
    meta.write_text("Eval Task,Random\ncopa,50\n")
    with pytest.raises(ev.EvalError, match=r"eval_meta_data.csv is unreadable \(KeyError: 'Random baseline'\); it needs "
                       r"the columns 'Eval Task' and 'Random baseline'$"):
        ev.load_baselines(bundle)


def test_items_that_cannot_be_scored_and_folders_that_are_no_bundle_are_refused(tmp_path):
    """Mutants (item_problem, load_task, bundle_problem): a negative gold (choices[-1] in a shot, never
    right as an item), a bool gold among two choices, choices given as one string (scored letter by
    letter), an empty task file (a ZeroDivisionError), and a bundle without eval_data/ all let through."""
    bundle = write_bundle(tmp_path, {"copa": fixture_items("copa", 3)})
    path = tmp_path / "eval_bundle" / "eval_data" / ev.TASKS["copa"].path
    for line, msg in (('{"query": "q", "choices": ["a", "b"], "gold": -1}', "gold -1 is not an index into its 2 options"),
                      ('{"query": "q", "choices": ["a", "b"], "gold": false}', "gold False is not an index into its 2 options"),
                      ('{"query": "q", "choices": "ab", "gold": 0}', "the fields query, choices, gold must be text")):
        path.write_text(line + "\n")
        with pytest.raises(ev.EvalError, match=f"copa.jsonl:1: {msg}"):
            ev.load_task(bundle, "copa")
    path.write_text("")
    with pytest.raises(ev.EvalError, match=f"^{path} holds no items$"):
        ev.load_task(bundle, "copa")
    (tmp_path / "csv_only").mkdir()
    (tmp_path / "csv_only" / "eval_meta_data.csv").write_text("Eval Task,Random baseline\n")
    with pytest.raises(ev.EvalError, match=f"^--bundle: {tmp_path / 'csv_only'} has no eval_data;"):
        ev.get_bundle(str(tmp_path / "csv_only"))


def test_a_task_named_twice_is_evaluated_once(tmp_path):
    """Mutant (check_tasks): duplicates kept; the results dict hid them, but the task was scored twice."""
    assert ev.check_tasks(["copa", "squad", "copa"]) == ["copa", "squad"]
    items = fixture_items("copa", 4)
    model = RuleModel()
    ev.evaluate_core(model, CharTokenizer(), write_bundle(tmp_path, {"copa": items}), tasks=["copa", "copa"], batch_size=1)
    assert len(model.seen) == sum(len(it["choices"]) for it in items)


def test_the_task_files_are_where_the_dclm_bundle_keeps_them():
    """Mutant (TASKS): a path changed; write_bundle puts the fixtures wherever TASKS says, so only a
    real bundle would notice. The layout of DCLM's eval_data (nanochat's core.yaml dataset_uri)."""
    wk, cr, lu, sp, rc = ("world_knowledge", "commonsense_reasoning", "language_understanding",
                          "symbolic_problem_solving", "reading_comprehension")
    files = {"jeopardy": f"{wk}/jeopardy_all", "bigbench_qa_wikidata": f"{wk}/bigbench_qa_wikidata",
             "arc_easy": f"{wk}/arc_easy", "arc_challenge": f"{wk}/arc_challenge", "copa": f"{cr}/copa",
             "commonsense_qa": f"{cr}/commonsense_qa", "piqa": f"{cr}/piqa", "openbook_qa": f"{cr}/openbook_qa",
             "lambada_openai": f"{lu}/lambada_openai", "hellaswag": f"{lu}/hellaswag", "winograd": f"{lu}/winograd_wsc",
             "winogrande": f"{lu}/winogrande", "bigbench_dyck_languages": f"{sp}/bigbench_dyck_languages",
             "agi_eval_lsat_ar": f"{sp}/agi_eval_lsat_ar", "bigbench_cs_algorithms": f"{sp}/bigbench_cs_algorithms",
             "bigbench_operators": f"{sp}/bigbench_operators", "bigbench_repeat_copy_logic": f"{sp}/bigbench_repeat_copy_logic",
             "squad": f"{rc}/squad", "coqa": f"{rc}/coqa", "boolq": f"{rc}/boolq",
             "bigbench_language_identification": f"{lu}/bigbench_language_identification"}
    assert {t: task.path for t, task in ev.TASKS.items()} == {t: f + ".jsonl" for t, f in files.items()}


def test_the_table_names_a_full_run_core_and_a_partial_one_what_it_covered():
    """Mutants (format_table): every table called "CORE (n of 21 tasks)", or the item cap left out."""
    row = dict(kind="mc", shots=0, items=4, random_baseline=0.5, accuracy=0.75, centered=0.5)
    full = {"core": 0.5, "tasks": dict.fromkeys(ev.TASKS, row), "max_per_task": None}
    last = lambda result: ev.format_table(result).splitlines()[-1].rsplit(None, 1)
    assert last(full) == ["CORE", "+0.5000"]
    capped = dict(full, max_per_task=4)
    assert last(capped) == ["CORE, at most 4 items per task", "+0.5000"]
    assert last(dict(capped, tasks={"copa": row, "piqa": row})) == ["CORE (2 of 21 tasks), at most 4 items per task", "+0.5000"]


def test_a_batch_size_below_one_is_a_usage_error(tmp_path, capsys):
    """Mutant (main): --batch_size 0 let through, to fail later as `range() arg 3 must not be zero`."""
    empty_zip(tmp_path / "ckpt.pt")
    with pytest.raises(SystemExit) as e:
        ev.main(["--ckpt", str(tmp_path / "ckpt.pt"), "--batch_size", "0", "--bundle", str(tmp_path / "nowhere")])
    assert e.value.code == 2 and capsys.readouterr().err.splitlines()[-1].endswith("error: --batch_size must be at least 1")


def test_the_results_name_the_bundle_and_checkpoint_by_absolute_paths(tmp_path, monkeypatch):
    """Mutants (evaluate_core, main): "bundle" and "ckpt" recorded as given, relative to a folder the
    results file does not name."""
    load_bundle = ev.load_bundle
    a_run_that_loads_nothing(tmp_path, monkeypatch)  # b/eval_bundle, run/ckpt.pt
    monkeypatch.chdir(tmp_path)
    res = ev.evaluate_core(RuleModel(), CharTokenizer(), loaded=load_bundle("b/eval_bundle", ["copa"]))
    assert res["bundle"] == str(tmp_path / "b" / "eval_bundle")
    monkeypatch.setattr(ev, "evaluate_core", lambda *a, **k: res)
    ev.main(["--ckpt", "run/ckpt.pt", "--bundle", "b/eval_bundle", "--tasks", "copa", "--device", "cpu"])
    assert json.loads((tmp_path / "run" / "core_eval_partial.json").read_text())["ckpt"] == str(tmp_path / "run" / "ckpt.pt")


def test_an_error_of_several_lines_is_reported_by_its_first(tmp_path, monkeypatch):
    """Mutant (main): the whole str(e) after "eval.py: error:", e.g. torch's CUDA hints on further lines."""
    bundle, ckpt = a_run_that_loads_nothing(tmp_path, monkeypatch)
    for error, said in ((RuntimeError("\nCUDA error: device-side assert triggered\nCompile with TORCH_USE_CUDA_DSA\n"),
                         "CUDA error: device-side assert triggered"), (ValueError(""), "ValueError")):
        monkeypatch.setattr(ev, "evaluate_core", lambda *a, e=error, **k: (_ for _ in ()).throw(e))
        with pytest.raises(SystemExit) as e:
            ev.main(["--ckpt", str(ckpt), "--device", "cpu", "--bundle", str(bundle)])
        assert e.value.code == f"eval.py: error: {said}"
