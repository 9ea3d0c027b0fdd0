"""A sweep's configuration as plain data (:class:`SweepConfig`), and its one validation step.

Building a :class:`SweepConfig` (or reading one back with :meth:`SweepConfig.from_dict` or
:meth:`SweepConfig.stored`) checks nothing and imports nothing. :meth:`SweepConfig.validate` is the
write side's step: it imports ``config.imports`` (user modules that register scores or ablation
kinds), checks every option, every score key and every ablation spec against the registries, and fills in what the options imply
(``decision="per_step"`` for generation tasks). :func:`~inactive_heads.sweep.run.run_sweep`, the
command line and every Ray worker call it; reading a results folder never does, so a folder opens on
a machine without the score modules that produced it.
"""

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from typing import Any

from ..ablation.head_ablation import AblationSpec
from ..analysis.tables import BASELINE
from ..core.errors import UserError, WrongTypeError
from ..core.modules import import_modules
from ..evaluation.tasks import task_kind
from ..models.devices import DTYPES as _DTYPE_TABLE
from ..models.loading import BACKENDS, DEFAULT_MODEL
from ..scoring.calibration import DEFAULT_QUANTILES, Thresholds, calibrate_on, check_quantiles, official_thresholds
from ..scoring.scores import PAPER_SCORES, STATIC_SUFFIX, get_score, score_label

DTYPES = (*_DTYPE_TABLE, "auto")  # the names models.devices knows, and "auto"
# Options a resume may change: the evaluator's answers do not depend on them, its log-likelihoods
# only within float rounding (each record keeps the batch size it ran with). The device enters the identity by its type only (cpu, cuda, mps).
RESUMABLE_OPTIONS = ("batch_size",)
# Options of generation tasks (gsm8k) only.
GENERATION_OPTIONS = ("decision", "max_gen_toks")


def run_id(key: str | None, q: float | int | None) -> str:
    """The id (and file name) of a run: ``baseline`` or ``<score>@p=<repr of p>``, e.g.
    ``awft@p=0.001``. ``repr`` of a float is the shortest text that reads back as the same
    number, so distinct p never share an id.

    >>> run_id("awft", 0.001), run_id("awft", 0.004), run_id("random", 0), run_id(None, None)
    ('awft@p=0.001', 'awft@p=0.004', 'random@p=0.0', 'baseline')
    """
    return BASELINE if key is None else f"{key}@p={float(q)!r}"


@dataclass
class SweepConfig:
    """Everything that defines a sweep; round-trips to JSON (``sweep.json``) and backs the CLI.

    ``thresholds="calibrated"`` takes quantiles of scores recorded on the evaluation inputs
    (as the paper does); ``"official:<model>"`` uses the paper's released thresholds for one of
    its 14 models (keys of ``calibration.official_models()``).

    ``imports``: modules imported before anything else (here and in every Ray worker), e.g. the
    module whose ``@ih.register_score`` functions the sweep's ``scores`` name, or whose
    ``@ih.register_ablation`` kinds its ``ablations`` name.

    ``ablations``: fixed ablations run once each beside the score curves (no p, no τ), stored as
    their specs; each run's id is :func:`ablation_key` of its spec.

    ``dtype="auto"`` and ``device=None`` are settled by the model that runs: ``sweep.json`` stores
    the dtype it computed in and its device type (:meth:`resolved`).

    Plain data: building one checks nothing; :meth:`validate` checks it (``run_sweep`` calls it).
    """

    model: str = DEFAULT_MODEL
    task: str = "mmlu"
    subjects: list[str] | None = None
    limit: int | None = None
    num_fewshot: int | None = None
    apply_chat_template: bool | None = None
    scores: list[str] = field(default_factory=lambda: list(PAPER_SCORES))
    quantiles: list[float] = field(default_factory=lambda: list(DEFAULT_QUANTILES))
    include_random: bool = True
    batch_size: int = 8
    dtype: str = "auto"  # the model config's dtype on a GPU, float32 on the CPU (the toolkit's one default)
    backend: str = "auto"  # models.load_model picks the faithful backend per architecture
    device: str | None = None  # None: the first GPU if any, else the CPU (devices.resolve_device)
    n_ctx: int | None = None  # None: the model config's context length
    seed: int = 0
    thresholds: str = "calibrated"
    source: str | None = None
    # Evaluation speed (evaluate's options of the same names): prefix reuse gives the same numbers up
    # to float rounding, not to the bit, so it is off unless asked for.
    reuse_prefix: bool = False
    attention: str = "auto"
    imports: list[str] = field(default_factory=list)
    # Generation tasks (gsm8k) only: how the heads are decided while generating
    # (evaluation.generation: "per_step", the authors' protocol, or "prompt") and the new tokens.
    decision: str | None = None
    max_gen_toks: int | None = None
    # Static runs beside the dynamic ones: for each score and p > 0, one fixed set of
    # round(p · layers · heads) heads (pruning.static_heads with this rule), chosen on the
    # calibration questions [first, end) (of each MMLU subject), which must come after the
    # evaluated ones (limit <= first). None: no static runs.
    static_rule: str | None = None
    static_calibration: list[int] | None = None
    # Fixed ablations beside the score curves: one run each, of any registered kind (the module
    # that registers it goes in ``imports``), as spec dicts ``{"kind": ..., **params}`` or the text
    # ``ih.evaluate`` reads (:func:`~inactive_heads.ablation.coerce.parse_ablation`); validate()
    # stores each as its spec. Empty: not written to sweep.json (older folders read the same).
    ablations: list[dict[str, Any] | str] = field(default_factory=list)
    # The window of questions evaluated: each subject's (each split's) questions from
    # ``questions_from`` up to ``limit`` (0: from the first). ``predict eval`` evaluates the
    # questions after the ones its predictors were fit on this way.
    questions_from: int = 0
    # Keep each ablated run's zeroed heads per input (``runs/<id>.flags.safetensors``, [input,
    # layer, head]); local executor, log-likelihood tasks and generation with decision="prompt".
    save_flags: bool = False

    def validate(self) -> "SweepConfig":
        """Check every option and settle what they imply, in place; returns the config. Imports
        ``imports`` first (they may register the scores the config names). The write side's step
        (:func:`~inactive_heads.sweep.run.run_sweep`, the command line, each Ray worker); bad input is
        a one-line :class:`~inactive_heads.core.errors.UserError` (an unknown score: ``KeyError``)."""
        if not isinstance(self.imports, (list, tuple)) or not all(isinstance(m, str) and m for m in self.imports):
            raise UserError(f"imports must be a list of module names, got {self.imports!r}")
        self.imports = list(self.imports)
        import_modules(self.imports, what="sweep imports")  # first: the modules may register scores and kinds
        self._check_ablations()

        task_kind(self.task)
        self._check_generation_options()
        if self.limit is not None and (not isinstance(self.limit, int) or self.limit < 1):
            raise UserError(f"limit must be a positive integer, got {self.limit!r}")
        if not isinstance(self.batch_size, int) or self.batch_size < 1:
            raise UserError(f"batch_size must be a positive integer, got {self.batch_size!r}")
        if self.dtype not in DTYPES:
            raise UserError(f"unknown dtype '{self.dtype}'; use one of {', '.join(DTYPES)}")
        if self.backend not in BACKENDS:
            raise UserError(f"unknown backend '{self.backend}'; use one of {', '.join(BACKENDS)}")
        from ..evaluation.evaluator import ATTENTION_MODES

        if self.attention not in ATTENTION_MODES:
            raise UserError(f"unknown attention '{self.attention}'; use one of {', '.join(ATTENTION_MODES)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise UserError(f"seed must be an integer, got {self.seed!r}")
        if not isinstance(self.reuse_prefix, bool):
            raise UserError(f"reuse_prefix must be true or false, got {self.reuse_prefix!r}")
        if self.n_ctx is not None and (not isinstance(self.n_ctx, int) or self.n_ctx < 1):
            raise UserError(f"n_ctx must be a positive integer, got {self.n_ctx!r}")
        if isinstance(self.scores, str) or not isinstance(self.scores, (list, tuple)):
            raise WrongTypeError(f"scores must be a list of score keys, got {type(self.scores).__name__}")
        self.scores = [s for s in self.scores if s != "random"]
        if not self.scores and not self.include_random and not self.ablations:
            raise UserError("the sweep has no score functions; pass some scores, keep Random or add ablations")
        for key in self.scores:
            get_score(key)
        self.quantiles = list(check_quantiles(self.quantiles, distinct=True))
        self._check_static_options()  # after limit and quantiles are checked
        self._check_window()
        if self.thresholds != "calibrated" and not (isinstance(self.thresholds, str)
                                                    and self.thresholds.startswith("official:")):
            raise UserError(
                f"thresholds must be 'calibrated' or 'official:<model>', got {self.thresholds!r}"
            )
        if self.thresholds.startswith("official:"):
            for key in self.scores + (["random"] if self.include_random else []):
                thresholds_for(self, key, None)  # unknown model, score or p: fails here, before any loading
        if self.subjects is not None:
            from ..evaluation.tasks import check_subjects

            self.subjects = check_subjects(self.task, list(self.subjects))
        return self

    def _check_generation_options(self) -> None:
        from ..evaluation.generation import DECISIONS

        if not self.is_generation:
            if any(getattr(self, name) is not None for name in GENERATION_OPTIONS):
                raise UserError(f"{' and '.join(GENERATION_OPTIONS)} apply to generation tasks (gsm8k) only; "
                                f"leave them unset for task '{self.task}'")
            return
        if self.decision is None:
            self.decision = "per_step"  # the authors' protocol; sweep.json says it explicitly
        if self.decision not in DECISIONS:
            raise UserError(f"unknown decision '{self.decision}'; use one of {', '.join(DECISIONS)}")
        if self.max_gen_toks is not None and (isinstance(self.max_gen_toks, bool)
                                              or not isinstance(self.max_gen_toks, int) or self.max_gen_toks < 1):
            raise UserError(f"max_gen_toks must be a positive integer, got {self.max_gen_toks!r}")
        unsupported = [name for name, value, default in (
            ("attention", self.attention, "auto"), ("source", self.source, None)) if value != default]
        if unsupported:
            raise UserError(f"{', '.join(unsupported)} apply to log-likelihood tasks only; leave them unset "
                            f"for task '{self.task}'")
        if self.reuse_prefix and self.decision != "per_step":
            raise UserError(f"reuse_prefix applies to decision 'per_step' in generation tasks, got decision "
                            f"'{self.decision}'; drop reuse_prefix or use decision per_step")

    def _check_static_options(self) -> None:
        from ..pruning.static import RULES

        if self.static_rule is None:
            if self.static_calibration is not None:
                raise UserError("static_calibration needs static_rule (flag_rate or mean); set both or neither")
            return
        if self.static_rule not in RULES:
            raise UserError(f"unknown static_rule '{self.static_rule}'; use one of {', '.join(RULES)}")
        if task_kind(self.task) != "multiple_choice":
            raise UserError(f"static runs apply to the built-in multiple-choice tasks; remove static_rule for "
                            f"task '{self.task}'")
        cal = self.static_calibration
        if (not isinstance(cal, (list, tuple)) or len(cal) != 2
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in cal) or not 0 <= cal[0] < cal[1]):
            raise UserError(f"static_calibration must be [first, end) question indices with 0 <= first < end, "
                            f"got {cal!r}; e.g. [200, 400] with limit=200")
        self.static_calibration = list(cal)
        if self.limit is None or self.limit > cal[0]:
            raise UserError(f"static sets are chosen on questions {cal[0]}..{cal[1] - 1} and evaluated on the first "
                            f"limit={self.limit} questions: set limit <= {cal[0]} so that no question is used for both")
        if not [q for q in self.quantiles if q > 0]:
            raise UserError("static runs need a quantile p > 0 (the fraction of heads in each set)")

    def _check_window(self) -> None:
        first = self.questions_from
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise UserError(f"questions_from must be a question index >= 0, got {first!r}")
        if first and (self.limit is None or self.limit <= first):
            raise UserError(f"questions_from={first} evaluates each subject's questions {first}..limit-1, so it "
                            f"needs limit > {first}, got limit={self.limit!r}")
        if not isinstance(self.save_flags, bool):
            raise UserError(f"save_flags must be true or false, got {self.save_flags!r}")
        if self.save_flags and self.reuse_prefix:
            raise UserError("save_flags keeps one set of zeroed heads per input, which prefix reuse shares "
                            "between inputs; drop save_flags or reuse_prefix")
        if self.save_flags and self.is_generation and self.decision != "prompt":
            raise UserError(f"save_flags keeps one set of zeroed heads per input, which generation has only with "
                            f"decision 'prompt' (got {self.decision!r}); drop save_flags or use decision prompt")

    def _check_ablations(self) -> None:
        from ..ablation.coerce import as_ablation

        if not isinstance(self.ablations, (list, tuple)):
            raise UserError(f"ablations must be a list of ablation specs ({{'kind': ...}}), got {self.ablations!r}")
        specs = []
        for item in self.ablations:
            if not isinstance(item, (dict, str)):
                raise UserError(f"each of ablations is a spec dict ({{'kind': ...}}) or ablation text, got {item!r}")
            ablation = as_ablation(item, seed=self.seed)  # unknown kind: one line listing the registered kinds
            if ablation is None:
                raise UserError(f"ablation {item!r} zeroes nothing (that run is the baseline); remove it")
            spec = ablation.to_spec()
            if spec in specs:
                raise UserError(f"ablation {json.dumps(spec)} is listed twice; list each ablation once")
            specs.append(spec)
        self.ablations = specs

    def ablation_runs(self) -> dict[str, dict[str, Any]]:
        """The run key (:func:`ablation_key`) of each of ``ablations``, in order, with its spec."""
        return {ablation_key(spec): spec for spec in self.ablations}

    @property
    def static_keys(self) -> list[str]:
        """The curve key of each score's static runs (``"ahon_ln@static"``); empty without static runs."""
        return [key + STATIC_SUFFIX for key in self.scores] if self.static_rule else []

    @property
    def is_generation(self) -> bool:
        """Whether the task generates (gsm8k): exact match of greedy generations."""
        return task_kind(self.task) == "generation"

    def to_dict(self) -> dict[str, Any]:
        """The options as JSON data; ``ablations``, ``questions_from`` and ``save_flags`` only when
        they are set (so a sweep without them keeps the sweep.json it had before they existed)."""
        d = asdict(self)
        for f in fields(self):
            if f.name in _LEFT_OUT_AT_DEFAULT and d[f.name] == _default(f):
                del d[f.name]
        return d

    @classmethod
    def stored(cls, d: dict[str, Any]) -> "SweepConfig":
        """The config a results folder stores, as plain data: no module imported, no option checked
        (that was done when the sweep ran); an option this version does not know is left out, one
        it knows that the folder lacks (an older folder) takes its default."""
        config = object.__new__(cls)
        for f in fields(cls):
            setattr(config, f.name, d[f.name] if f.name in d else _default(f))
        return config

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepConfig":
        """Inverse of :meth:`to_dict`; an unknown option is an error. Checks nothing else (:meth:`validate`)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"unknown sweep option(s) {unknown}; known: {sorted(known)}")
        return cls(**d)

    def resolved(self, *, dtype: str, device: str) -> "SweepConfig":
        """This config as ``sweep.json`` stores it: ``dtype`` and the type of ``device`` (``"cuda:1"``
        gives ``"cuda"``) are those the model computes in, never ``"auto"`` or None."""
        return replace(self, dtype=dtype, device=device_type(device))

    def identity(self) -> dict[str, Any]:
        """What a resume must share with the run it resumes: every option but the
        :data:`RESUMABLE_OPTIONS`, the device by its type only. Every option, also those
        :meth:`to_dict` leaves out when empty (an older folder's sweep.json lacks them)."""
        d = {k: v for k, v in asdict(self).items() if k not in RESUMABLE_OPTIONS}
        d["device"] = None if self.device is None else device_type(self.device)
        return d

    def run_ids(self) -> list[tuple[str, str | None, float | None]]:
        """(run id, score key, quantile) for every run, baseline first."""
        ids: list[tuple[str, str | None, float | None]] = [(BASELINE, None, None)]
        keys = list(self.scores) + (["random"] if self.include_random else [])
        for key in keys:
            for q in self.quantiles:
                ids.append((run_id(key, q), key, q))
        for key in self.static_keys:
            for q in self.quantiles:
                if q > 0:
                    ids.append((run_id(key, q), key, q))
        ids += [(key, key, None) for key in self.ablation_runs()]  # one run each, no p
        return ids

    @property
    def records_scores(self) -> bool:
        """Whether the baseline pass records scores (calibrated thresholds for some score)."""
        return bool(self.scores) and self.thresholds == "calibrated"

    @property
    def evaluate_attention(self) -> str:
        """The attention form of every pass: every pass of a sweep is compared with zeroed ones, so
        ``"auto"`` is the exact form for all of them (:func:`~inactive_heads.evaluation.evaluator.resolve_attention`)."""
        from ..evaluation.evaluator import resolve_attention

        return resolve_attention(self.attention, exact=True)

    def reuses_baseline(self, key: str | None, q: float | None) -> bool:
        """A run that zeroes nothing by construction: p = 0 with τ calibrated on these very inputs
        (the pooled minimum, or maximum, flags no head), or Random at p = 0. Generation runs
        always run: their passes see generated tokens the calibration never saw."""
        if self.is_generation:
            return False
        return key is not None and q == 0 and (key == "random" or self.thresholds == "calibrated")


_LEFT_OUT_AT_DEFAULT = ("ablations", "questions_from", "save_flags")


def _default(f) -> Any:
    """A dataclass field's default value."""
    return f.default_factory() if f.default is MISSING else f.default


def device_type(device: str) -> str:
    """``"cuda:1"`` -> ``"cuda"``; ``"cpu"`` -> ``"cpu"``."""
    return str(device).split(":", 1)[0]


def ablation_key(spec: dict[str, Any]) -> str:
    """The run id (and score key) of one of a sweep's ``ablations``: ``<kind>@<8 hex digits>``, a
    hash of the spec's JSON, so it is stable, distinct per spec, and never a score curve's
    ``<score>@p=...`` or ``baseline``.

    >>> ablation_key({"kind": "static", "heads": [[0, 1]], "score": None, "threshold": None, "seed": 0})
    'static@082ae812'
    """
    text = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    return f"{spec['kind']}@{hashlib.sha256(text.encode()).hexdigest()[:8]}"


def run_label(config: SweepConfig, key: str | None) -> str:
    """A record's ``label``: the score's ("AHON (LN)"), or one of ``ablations``' spec name
    (``"zero_heads(heads=[[0, 1]])"``)."""
    if key is None:
        return "No ablation"
    custom = config.ablation_runs().get(key)
    return AblationSpec.from_dict(custom).name if custom is not None else score_label(key)


def run_threshold(thresholds: dict[str, Thresholds], key: str, q: float | None) -> float | None:
    """τ of a run at p = ``q``; None for one of ``ablations`` (no p, no τ)."""
    return None if q is None else thresholds[key].at(q)


def thresholds_for(config: SweepConfig, key: str, head_scores) -> Thresholds:
    """τ for each of the config's quantiles: calibrated on ``head_scores`` or the paper's preset."""
    if config.thresholds.startswith("official:"):
        model_name = config.thresholds.split(":", 1)[1]
        t = official_thresholds(model_name, config.task, key)
        missing = [q for q in config.quantiles if not t.has(q)]
        if missing:
            raise UserError(f"no official threshold at p={missing[0]!r} for '{key}' of {model_name}; "
                             f"official thresholds exist for p in {list(t.quantiles)}")
        picked = [t.at(q) for q in config.quantiles]
        return Thresholds(key, tuple(config.quantiles), tuple(picked), t.direction, t.source, t.n_scores)
    return calibrate_on(None, head_scores, key, config.quantiles)  # recorded in the baseline pass


def ablation_for(config: SweepConfig, key: str | None, tau: float | None, heads=None) -> AblationSpec | None:
    """The run's ablation: none (baseline), Random, a dynamic score at τ, the static ``heads``
    (a :class:`~inactive_heads.pruning.static.HeadSet`) of a static run, or one of ``config.ablations``."""
    if key is None:
        return None
    custom = config.ablation_runs().get(key)
    if custom is not None:
        return AblationSpec.from_dict(custom)
    if heads is not None:
        return AblationSpec("static", heads=tuple(heads))
    if key == "random":
        return AblationSpec("random", threshold=tau, seed=config.seed)
    return AblationSpec("dynamic", score=key, threshold=tau, seed=config.seed)


