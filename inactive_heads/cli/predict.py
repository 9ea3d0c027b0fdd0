"""``inactive-heads predict`` (its logic is in :mod:`inactive_heads.prediction.command`)."""

import argparse

from . import options
from .options import add_model_arguments, add_task_arguments, positive_int, quantile
from .registry import register_subcommand


def _add_predict_arguments(parser: argparse.ArgumentParser) -> None:
    from ..prediction.command import add_arguments

    add_arguments(parser, model_arguments=add_model_arguments, task_arguments=add_task_arguments,
                  positive_int=positive_int, quantile=quantile)


def _run_predict(args: argparse.Namespace) -> int:
    from ..prediction.command import run

    return run(args, load=options.load)


register_subcommand("predict", "fit a causal predictor of the in-pass oracle, or evaluate one on held-out questions",
                    _add_predict_arguments, _run_predict)
