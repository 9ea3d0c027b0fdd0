"""lm-eval's tokenization of log-likelihood requests, without a model type around it.

:class:`RequestTokenizer` turns an lm-eval request (context, continuation) into context and
continuation token ids with the rules of lm-eval's Hugging Face model ``HFLM``: the tokenizer's
own special tokens unless ``add_bos_token`` says otherwise, none when the text already starts
with BOS, trailing context whitespace moved onto the continuation (lm-eval's own
``TemplateLM._encode_pair`` does the split). The planning of lm-eval tasks
(:func:`~inactive_heads.evaluation.lm_eval_tasks.plan_lm_eval_task`) and the ``inactive-heads``
lm-eval model type share it, so both give the same tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import UserError
from ..models.loading import model_info


def plain_tokenizer(model):
    """The model's tokenizer as ``AutoTokenizer`` loads it (as HFLM has it).

    TransformerLens switches ``add_bos_token`` on in the tokenizer it holds, which would change
    what ``encode`` returns; so the tokenizer is reloaded from the model's directory when there is one.
    """
    info = model_info(model)
    source = Path(str(info.source))
    if not (source / "tokenizer_config.json").is_file():
        raise UserError(
            f"no tokenizer files in {source!s} (the source of model {info.name!r}); the lm-eval model "
            "reloads the tokenizer from the model's directory: load the model with load_model(<dir>)"
        )
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source)


class RequestTokenizer:
    """Tokenizes lm-eval requests for ``model`` as lm-eval's ``HFLM`` does (needs lm-eval)."""

    #: read by lm-eval's ``TemplateLM._encode_pair``: a decoder-only model encodes context and
    #: continuation together, then splits them
    backend = "causal"

    def __init__(self, model: Any, *, add_bos_token: bool | None = None, max_length: int | None = None):
        self.info = model_info(model)
        self.tokenizer = plain_tokenizer(model)
        self.add_bos_token = add_bos_token
        self._max_length = int(max_length) if max_length else None

    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    @property
    def max_length(self) -> int:
        return self._max_length or self.info.n_ctx

    @property
    def tokenizer_name(self) -> str:
        return self.tokenizer.name_or_path.replace("/", "__")

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        from lm_eval.models.utils import _add_special_kwargs, has_bos_prefix

        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        return self.tokenizer.encode(string, **special)

    def _encode_pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        from lm_eval.api.model import TemplateLM

        return TemplateLM._encode_pair(self, context, continuation)

    def encode_request(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation tokens of one log-likelihood request, as ``loglikelihood`` makes them."""
        if context:
            return self._encode_pair(context, continuation)
        # An empty context conditions on the prefix token (BOS, else EOS), unless the continuation starts with it.
        continuation_ids = self.tok_encode(continuation, add_special_tokens=False)
        if continuation_ids[0] == self.prefix_token_id:
            return continuation_ids[:1], continuation_ids[1:]
        return [self.prefix_token_id], continuation_ids

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return self.tokenizer.apply_chat_template(
            chat_history,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=not add_generation_prompt,
        )
