"""The versions of the libraries a result was computed with (results, reports, benchmarks)."""

from importlib.metadata import PackageNotFoundError, version


def _version(distribution: str) -> str | None:
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def toolkit_version() -> str:
    """This package's installed version ("unknown" when run from a source tree without install)."""
    return _version("inactive-heads") or "unknown"


def library_versions() -> dict[str, str | None]:
    """``{"<library>_version": version}`` for this package and the libraries its numbers depend on
    (None for one that is not installed): what a benchmark's JSON line carries."""
    return {
        "inactive_heads_version": toolkit_version(),
        "transformer_lens_version": _version("transformer-lens"),
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "lm_eval_version": _version("lm-eval"),
    }
