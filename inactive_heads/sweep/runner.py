"""The paper's experiment: calibrate thresholds, then evaluate every (score, threshold) ablation.

A sweep writes one results folder::

    sweep.json          the SweepConfig that produced it, with the dtype and the device type the
                        model ran in (re-running checks that the sweep's identity matches)
    scores.safetensors  HeadScores recorded in the baseline pass, on the evaluation inputs themselves
    thresholds.json     one Thresholds per score (quantiles of the pooled CDF, or the paper's preset)
    runs/<id>.json      one record per finished run, written atomically the moment it finishes
    static_scores.safetensors, static_heads.json
                        with static runs: HeadScores of the calibration questions and the head
                        set of each static run
    runs.parquet        one row per run (written when the sweep command ends)
    questions.parquet   one row per run x question
    .lock               while a driver works on the folder: its host and pid

``sweep.json`` and every record carry ``"format_version"`` (:data:`RESULTS_FORMAT`); a folder
without one was written before versions were kept (format 1) and reads the same. Reading a folder
(:meth:`SweepResults.load`, :func:`load_results`, the report) takes its stored options as plain
data: it imports no user module and checks no name against the registries, so a folder opens on a
machine without the score modules that produced it. A folder of a newer format is a one-line error
naming the version it needs.

Re-running the same command skips finished runs, so an interrupted sweep loses nothing. A resume
must compute in the same dtype on the same device type (``cpu``, ``cuda``, ``mps``); the batch
size and the device index may change (answers do not depend on them, log-likelihoods only within
float rounding). The unablated model runs once: that baseline pass also records the scores used
for calibration. A p = 0 run whose threshold was calibrated on these inputs (or Random at p = 0)
zeroes nothing by construction; its record is the baseline's, marked ``"reused_from": "baseline"``.

:func:`~inactive_heads.sweep.run.run_sweep` picks the executor: this module's local one, or Ray
actors (:mod:`inactive_heads.sweep.ray_executor`), whose records are identical to the local executor's.
"""

import importlib
import json
import os
import socket
import time
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from ..ablation.head_ablation import AblationSpec
from ..analysis.tables import BASELINE
from ..scoring.calibration import DEFAULT_QUANTILES, Thresholds, calibrate, check_quantiles, official_thresholds
from ..core.io import write_json_atomic
from ..models.devices import DTYPES as _DTYPE_TABLE
from ..models.loading import BACKENDS, DEFAULT_MODEL
from ..scoring.scores import PAPER_SCORES, STATIC_SUFFIX, get_score, score_label
from ..core.errors import MissingFileError, UserError
from ..evaluation.tasks import task_kind

DTYPES = (*_DTYPE_TABLE, "auto")  # the names models.devices knows, and "auto"
EXECUTORS = ("local", "ray")
SCORES_FILE = "scores.safetensors"
LEGACY_SCORES_FILE = "scores.pt"
STATIC_SCORES_FILE = "static_scores.safetensors"
STATIC_HEADS_FILE = "static_heads.json"
VOLATILE_FIELDS = ("seconds", "finished_at")
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
    module whose ``@ih.register_score`` functions the sweep's ``scores`` name.

    ``dtype="auto"`` and ``device=None`` are settled by the model that runs: ``sweep.json`` stores
    the dtype it computed in and its device type (:meth:`resolved`).
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

    def __post_init__(self):
        if isinstance(self.imports, str) or not all(isinstance(m, str) and m for m in self.imports):
            raise UserError(f"imports must be a list of module names, got {self.imports!r}")
        self.imports = list(self.imports)
        import_modules(self.imports)  # before the score keys are checked: the modules may register some

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
        if not isinstance(self.reuse_prefix, bool):
            raise UserError(f"reuse_prefix must be true or false, got {self.reuse_prefix!r}")
        if self.n_ctx is not None and (not isinstance(self.n_ctx, int) or self.n_ctx < 1):
            raise UserError(f"n_ctx must be a positive integer, got {self.n_ctx!r}")
        self.scores = [s for s in self.scores if s != "random"]
        if not self.scores and not self.include_random:
            raise UserError("the sweep has no score functions; pass some scores or keep Random")
        for key in self.scores:
            get_score(key)
        self.quantiles = list(check_quantiles(self.quantiles, distinct=True))
        self._check_static_options()  # after limit and quantiles are checked
        if self.thresholds != "calibrated" and not self.thresholds.startswith("official:"):
            raise UserError(
                f"thresholds must be 'calibrated' or 'official:<model>', got {self.thresholds!r}"
            )
        if self.thresholds.startswith("official:"):
            for key in self.scores + (["random"] if self.include_random else []):
                thresholds_for(self, key, None)  # unknown model, score or p: fails here, before any loading
        if self.subjects is not None:
            from ..evaluation.tasks import MMLU_SUBJECTS

            self.subjects = list(self.subjects)
            if self.task != "mmlu":
                raise UserError(f"subjects apply to MMLU only; remove them for task '{self.task}'")
            unknown = [s for s in self.subjects if s not in MMLU_SUBJECTS]
            if unknown:
                raise UserError(
                    f"unknown MMLU subject '{unknown[0]}'; valid subjects are listed in "
                    "inactive_heads.evaluation.tasks.MMLU_SUBJECTS (e.g. abstract_algebra, anatomy, astronomy)"
                )

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

    @property
    def static_keys(self) -> list[str]:
        """The curve key of each score's static runs (``"ahon_ln@static"``); empty without static runs."""
        return [key + STATIC_SUFFIX for key in self.scores] if self.static_rule else []

    @property
    def is_generation(self) -> bool:
        """Whether the task generates (gsm8k): exact match of greedy generations."""
        from ..evaluation.tasks import GENERATION_TASKS

        return self.task in GENERATION_TASKS

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def stored(cls, d: dict[str, Any]) -> "SweepConfig":
        """The config a results folder stores, as plain data: no module imported, no option checked
        (that was done when the sweep ran); an option this version does not know is left out, one
        it knows that the folder lacks (an older folder) takes its default."""
        config = object.__new__(cls)
        for f in fields(cls):
            if f.name in d:
                value = d[f.name]
            elif f.default is not MISSING:
                value = f.default
            else:
                value = f.default_factory()
            setattr(config, f.name, value)
        return config

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SweepConfig":
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
        :data:`RESUMABLE_OPTIONS`, the device by its type only."""
        d = {k: v for k, v in self.to_dict().items() if k not in RESUMABLE_OPTIONS}
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


def device_type(device: str) -> str:
    """``"cuda:1"`` -> ``"cuda"``; ``"cpu"`` -> ``"cpu"``."""
    return str(device).split(":", 1)[0]


def import_modules(names: list[str]) -> None:
    """Import each module (a user module that registers scores, say); a failure is one line."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # the user's module: whatever it raises is bad input here
            raise UserError(f"cannot import module '{name}' (sweep imports): {type(err).__name__}: {err}; "
                            "make it importable (PYTHONPATH) or remove it") from err


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
    return calibrate(head_scores, key, config.quantiles)


# ----------------------------------------------------------------------------------------------
# The steps of a sweep, shared by the local and the Ray executor


class FolderInUseError(UserError, RuntimeError):
    """Another driver holds the results folder's lock."""


class FolderLock:
    """``<out>/.lock`` (host, pid) while a driver works on a folder; a second driver refuses.

    A lock left by a process that no longer runs on this host is taken over.
    """

    def __init__(self, out: Path):
        self.path = Path(out) / ".lock"
        self.mine = False

    def __enter__(self) -> "FolderLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"host": socket.gethostname(), "pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666)
            except FileExistsError:
                if not self._stale():
                    other = self._holder()
                    raise FolderInUseError(
                        f"'{self.path.parent}' is in use by another sweep (pid {other.get('pid')} on "
                        f"{other.get('host')} since {other.get('since')}); wait for it, or delete "
                        f"{self.path} if that process is gone"
                    ) from None
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                json.dump(me, f)
            self.mine = True
            return self
        raise RuntimeError(f"could not take the lock {self.path}; delete it if no sweep is running")

    def _holder(self) -> dict[str, Any]:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def _stale(self) -> bool:
        other = self._holder()
        if other.get("host") != socket.gethostname() or not isinstance(other.get("pid"), int):
            return False
        try:
            os.kill(other["pid"], 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def __exit__(self, *exc) -> None:
        if self.mine:
            self.path.unlink(missing_ok=True)
            self.mine = False


# The results folder format. 1: folders written before a version was kept (no "format_version").
# 2: "format_version" in sweep.json and in every record.
RESULTS_FORMAT = 2


def read_sweep_json(folder: Path) -> dict[str, Any]:
    """``folder/sweep.json`` without its ``format_version``, after checking that this version of
    the toolkit reads that format."""
    d = json.loads((folder / "sweep.json").read_text())
    check_format(d.pop("format_version", 1), folder / "sweep.json")
    return d


def check_format(version: Any, where: Path) -> None:
    """A one-line error for a results file of a format this version cannot read."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise UserError(f"'{where}' has format_version {version!r}; expected a positive integer")
    if version > RESULTS_FORMAT:
        raise UserError(f"'{where}' is in results format {version}; this inactive-heads reads formats up to "
                        f"{RESULTS_FORMAT}: upgrade inactive-heads to read it")


def stored_config(out: Path) -> SweepConfig | None:
    """The sweep ``out`` holds (None for a new folder), its dtype and device type resolved.

    ``sweep.json`` files of earlier versions may say ``dtype="auto"`` or ``device=None``; what
    ran is then read from the run records. Records that disagree (a sweep resumed in another
    precision) cannot be mixed: a one-line error.
    """
    path = out / "sweep.json"
    if not path.is_file():
        return None
    stored = SweepConfig.from_dict(read_sweep_json(out))
    if stored.dtype != "auto" and stored.device is not None:
        return stored
    records = [json.loads(f.read_text()) for f in sorted((out / "runs").glob("*.json"))]
    ran = sorted({(rec["dtype"], device_type(rec["device"])) for rec in records if rec.get("dtype") and rec.get("device")})
    if len(ran) > 1:
        raise UserError(f"'{out}' holds runs computed in {' and in '.join(f'{d} on {t}' for d, t in ran)} (its "
                        "sweep.json, from an earlier version, left the dtype unresolved); their numbers do not "
                        "mix: start a new folder")
    if not ran:
        return stored  # nothing ran yet: the dtype is settled by the first model that runs
    dtype, device = ran[0]
    return stored.resolved(dtype=dtype if stored.dtype == "auto" else stored.dtype,
                           device=device if stored.device is None else stored.device)


def check_folder(config: SweepConfig, out: Path) -> None:
    """Check that ``out`` holds this sweep, or nothing yet. A dtype of ``"auto"`` or a device of
    None, on either side, is compared once the model has settled it (:func:`prepare_folder`)."""
    stored = stored_config(out)
    if stored is None:
        return
    have, want = stored.identity(), config.identity()
    for key, unresolved in (("dtype", "auto"), ("device", None)):
        if unresolved in (have[key], want[key]):
            del have[key], want[key]
    differing = sorted(k for k in have if have[k] != want[k])
    other = [k for k in differing if k not in ("dtype", "device")]
    if other:
        raise UserError(f"'{out}' holds a different sweep (differs in {', '.join(other)}); "
                        "use another --out folder or delete it")
    if differing:
        here = config.dtype + ("" if config.device is None else f" on {device_type(config.device)}")
        raise UserError(f"'{out}' was computed in {stored.dtype} on {stored.device}, this run would compute in "
                        f"{here}; resume with --dtype {stored.dtype} "
                        f"--device {stored.device} (dtype=, device=), or use another --out folder")


def prepare_folder(config: SweepConfig, out: Path) -> None:
    """Check that ``out`` holds this sweep (or nothing yet) and write ``sweep.json``. ``config``
    is resolved (:meth:`SweepConfig.resolved`): its dtype and device type are the model's."""
    if config.dtype == "auto" or config.device is None:
        raise ValueError("prepare_folder needs a resolved config (SweepConfig.resolved)")
    config = config.resolved(dtype=config.dtype, device=config.device)  # the device's type, not its index
    check_folder(config, out)
    write_json_atomic(out / "sweep.json", {"format_version": RESULTS_FORMAT, **config.to_dict()})


def resolved_for(config: SweepConfig, model) -> SweepConfig:
    """``config`` resolved by the model that runs it: its dtype and its device's type."""
    from ..models.loading import model_info
    from ..runtime.hooks import model_device

    return config.resolved(dtype=model_info(model).dtype, device=str(model_device(model)))


def load_model_for(config: SweepConfig, progress: bool = True):
    from ..models.loading import load_model

    return load_model(config.model, backend=config.backend, dtype=config.dtype, device=config.device,
                      n_ctx=config.n_ctx, progress=progress)


def check_model_matches(config: SweepConfig, model) -> None:
    """A model passed to :func:`run_sweep` must be the one the config describes (dtype, backend, n_ctx, device)."""
    from ..models.devices import resolve_device
    from ..models.loading import model_info
    from ..runtime.hooks import model_device

    info = model_info(model)
    wanted = {
        "dtype": None if config.dtype == "auto" else config.dtype,
        "backend": None if config.backend == "auto" else config.backend,
        "n_ctx": config.n_ctx,
        "device": None if config.device is None else resolve_device(config.device),
    }
    actual = {"dtype": info.dtype, "backend": info.backend, "n_ctx": info.n_ctx, "device": str(model_device(model))}
    if actual["device"] == "cuda":
        actual["device"] = "cuda:0"
    for key, want in wanted.items():
        if want is not None and actual[key] != want:
            raise UserError(f"the model passed to run_sweep has {key} {actual[key]!r} but the sweep config says "
                             f"{want!r}; load it with load_model(..., {key}={want!r}) or change the config")


def plan_for(config: SweepConfig, model):
    """The sweep's inputs, tokenized once: an ``EvalPlan``, or for a generation task the list of
    :class:`~inactive_heads.evaluation.tasks.GenerationRequest`."""
    from ..evaluation.registry import plan_for_task

    return plan_for_task(model, config.task, subjects=config.subjects, limit=config.limit,
                         num_fewshot=config.num_fewshot, apply_chat_template=config.apply_chat_template,
                         source=config.source)


def sweep_inputs(config: SweepConfig, plan) -> list[list[int]]:
    """The token ids the scores are recorded on: the plan's inputs, or a generation task's prompts."""
    return [list(r.context_ids) for r in plan] if config.is_generation else plan.inputs


def scores_description(config: SweepConfig, plan) -> str:
    if config.is_generation:
        return f"{config.task} prompts ({len(plan)})"
    return f"{config.task} evaluation inputs ({len(plan.inputs)})"


def evaluate_run(config: SweepConfig, model, plan, ablation, *, progress: bool, record=None, prompt_ids=None):
    """One pass of the sweep (the baseline, with ``record``, or one ablation) with the sweep's options.

    A generation task generates (:func:`~inactive_heads.evaluation.generation.evaluate_generation`,
    ``config.decision``); its scores for calibration are recorded on the prompts, nothing zeroed,
    in the exact form (:func:`~inactive_heads.scoring.recording.record_scores`). ``prompt_ids``
    (generation only): each request's index in the whole sweep, when ``plan`` is a part of it."""
    evaluate_module = _evaluate_module()
    if not config.is_generation:
        return evaluate_module.evaluate(
            model, plan, ablation=ablation, batch_size=config.batch_size, progress=progress,
            reuse_prefix=config.reuse_prefix, attention=config.evaluate_attention, record=record,
            record_description=scores_description(config, plan) if record else None)
    from ..evaluation.generation import evaluate_generation

    result = evaluate_generation(model, config.task, ablation=ablation, decision=config.decision,
                                 limit=config.limit, num_fewshot=config.num_fewshot,
                                 apply_chat_template=config.apply_chat_template, max_gen_toks=config.max_gen_toks,
                                 reuse_prefix=config.reuse_prefix, batch_size=config.batch_size, progress=progress,
                                 requests=plan, prompt_ids=prompt_ids)
    result.head_scores = record_prompt_scores(config, model, plan, record, progress) if record else None
    return result


def record_prompt_scores(config: SweepConfig, model, requests, keys, progress: bool):
    """Scores for calibrating a generation sweep: recorded on its prompts, nothing zeroed."""
    from ..scoring.recording import record_scores

    return record_scores(model, sweep_inputs(config, requests), list(keys), batch_size=config.batch_size,
                         progress=progress, description=scores_description(config, requests))


def find_scores_file(out: Path) -> Path | None:
    """The folder's HeadScores file (``scores.safetensors``, or ``scores.pt`` of older folders)."""
    for name in (SCORES_FILE, LEGACY_SCORES_FILE):
        if (out / name).is_file():
            return out / name
    return None


def write_thresholds(config: SweepConfig, out: Path, head_scores) -> dict[str, Thresholds]:
    keys = list(config.scores) + (["random"] if config.include_random else [])
    thresholds = {key: thresholds_for(config, key, head_scores) for key in keys}
    write_json_atomic(out / "thresholds.json", {k: t.to_dict() for k, t in thresholds.items()})
    return thresholds


def ablation_for(config: SweepConfig, key: str | None, tau: float | None, heads=None) -> AblationSpec | None:
    """The run's ablation: none (baseline), Random, a dynamic score at τ, or the static ``heads``
    (a :class:`~inactive_heads.pruning.static.HeadSet`) of a static run."""
    if key is None:
        return None
    if heads is not None:
        return AblationSpec("static", heads=tuple(heads))
    if key == "random":
        return AblationSpec("random", threshold=tau, seed=config.seed)
    return AblationSpec("dynamic", score=key, threshold=tau, seed=config.seed)


def record_path(out: Path, rid: str) -> Path:
    return out / "runs" / f"{rid}.json"


def make_record(config: SweepConfig, rid: str, key: str | None, q: float | None, tau: float | None,
                result, plan, model, heads=None) -> dict[str, Any]:
    """The run record: what ran, its accuracy and realized zeroing, and every question's outcome.
    A static run (``heads``) also names its head set and the rule and questions that chose it; an
    ablated run, what an oracle skipping its zeroed heads would save. A generation task's record
    (``plan`` = its requests) keeps each question's generation and extracted answers instead of
    log-likelihoods; its ``accuracy`` is the strict exact match."""
    import torch

    from ..models.loading import model_info
    from ..runtime.hooks import model_device

    spec = ablation_for(config, key, tau, heads)
    info = model_info(model)
    outcomes = _generation_outcomes(result, plan) if config.is_generation else {
        "acc_norm": result.acc_norm,
        "realized_fraction": result.realized_fraction,
        "realized_percent": 100 * result.realized_fraction,
        "realized_fraction_per_layer": result.realized_fraction_per_layer,
        "n": result.n,
        "n_forward_sequences": result.n_forward_sequences,
        "correct": result.correct,
        "correct_norm": result.correct_norm,
        "loglikelihoods": result.loglikelihoods,
        "gold": [req.gold for req in plan.requests],
        "doc_ids": [req.doc_id for req in plan.requests],
        "subjects": [req.subject for req in plan.requests],
        "per_subject": result.per_subject,
    }
    static = {} if heads is None else {
        "static_rule": heads.rule, "static_calibration": config.static_calibration,
        "static_heads": [list(h) for h in heads], "static_n_sequences": heads.n_sequences,
    }
    oracle = {}
    if getattr(result, "flagged", None) is not None:
        from ..pruning.accountant import oracle_summary

        oracle["oracle_savings"] = oracle_summary(model, result.flagged, [len(x) for x in plan.inputs])
    return {
        "format_version": RESULTS_FORMAT,
        "run_id": rid,
        "model": config.model,
        "task": result.task,
        "score": key,
        "label": score_label(key) if key else "No ablation",
        "p": q,
        "threshold": tau,
        "accuracy": result.accuracy,
        "accuracy_percent": 100 * result.accuracy,
        **outcomes,
        "dtype": info.dtype,
        "device": str(model_device(model)),
        "backend": info.backend,
        "batch_size": config.batch_size,
        "torch_threads": torch.get_num_threads(),  # fp32 sums are ordered by the thread count
        "seconds": result.seconds,
        "ablation": spec.to_dict() if spec else None,
        **static,
        **oracle,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def _generation_outcomes(result, requests) -> dict[str, Any]:
    """A generation run's outcomes (a ``GenerationResult``), in the fields every record has."""
    return {
        "acc_norm": None,
        "accuracy_flexible": result.accuracy_flexible,
        "realized_fraction": result.realized_fraction,
        "realized_percent": 100 * result.realized_fraction,
        "realized_fraction_per_layer": result.realized_fraction_per_layer,
        "realized_fraction_prompts": result.realized_fraction_prompts,
        "decision": result.decision,
        "use_cache": result.use_cache,
        "n": result.n,
        "n_forward_sequences": result.n_forward_passes,
        "n_generated_tokens": result.n_generated_tokens,
        "correct": result.correct,
        "correct_norm": None,
        "correct_flexible": result.correct_flexible,
        "loglikelihoods": None,
        "gold": result.golds,
        "generations": result.generations,
        "answers": result.answers,
        "doc_ids": [req.doc_id for req in requests],
        "subjects": None,
        "per_subject": {},
        "savings": result.savings,
    }


def reused_record(config: SweepConfig, rid: str, key: str, q: float, tau: float,
                  baseline: dict[str, Any]) -> dict[str, Any]:
    """The record of a run that zeroes nothing by construction: the baseline's outcomes."""
    spec = ablation_for(config, key, tau)
    return {
        **baseline,
        "format_version": RESULTS_FORMAT,
        "run_id": rid,
        "score": key,
        "label": score_label(key),
        "p": q,
        "threshold": tau,
        "ablation": spec.to_dict(),
        "seconds": 0.0,
        "reused_from": BASELINE,
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }


def write_reused_runs(config: SweepConfig, out: Path, thresholds: dict[str, Thresholds]) -> None:
    """Write the records of the runs that reuse the baseline's (once the baseline is in)."""
    base_path = record_path(out, BASELINE)
    if not base_path.is_file():
        return
    baseline = json.loads(base_path.read_text())
    for rid, key, q in config.run_ids():
        if config.reuses_baseline(key, q) and not record_path(out, rid).is_file():
            write_json_atomic(record_path(out, rid),
                              reused_record(config, rid, key, q, thresholds[key].at(q), baseline))


def pending_runs(config: SweepConfig, out: Path) -> list[tuple[str, str, float]]:
    """Ablated runs still to evaluate (not finished, not reusing the baseline)."""
    return [(rid, key, q) for rid, key, q in config.run_ids()
            if key is not None and not config.reuses_baseline(key, q) and not record_path(out, rid).is_file()]


# ----------------------------------------------------------------------------------------------
# The local executor


def run_local(config: SweepConfig, out: Path, *, model=None, progress: bool = True) -> "SweepResults":
    """The local executor behind ``run_sweep(..., executor="local")``: the model is loaded once (or
    ``model``, which must be the model ``config.model`` names) and the task tokenized once for all runs."""
    with FolderLock(out):
        check_folder(config, out)  # before the model loads; dtype and device once it has
        if model is None:
            model = load_model_for(config, progress)
        else:
            check_model_matches(config, model)
        # The inputs first: a task the model cannot be prompted with (e.g. WinoGrande 0-shot with a
        # chat template) fails before sweep.json is written, leaving the folder as it was.
        plan = plan_for(config, model)
        prepare_folder(resolved_for(config, model), out)
        head_scores = _local_baseline(config, out, model, plan, progress)
        thresholds = write_thresholds(config, out, head_scores)
        write_reused_runs(config, out, thresholds)
        _local_runs(config, out, model, plan, thresholds, progress)
        results = SweepResults.load(out)
        results.write_tables()
    return results


def _evaluate_module():
    """The evaluate submodule (the package attribute of that name is the function); looked up
    at call time so tests can spy on ``evaluate``."""
    import importlib

    return importlib.import_module("inactive_heads.evaluation.evaluator")


def _local_baseline(config: SweepConfig, out: Path, model, plan, progress: bool):
    """The one unablated pass: the baseline record and, when thresholds are calibrated, the scores."""
    from ..scoring.recording import HeadScores

    scores_file = find_scores_file(out)
    head_scores = HeadScores.load(scores_file) if config.records_scores and scores_file else None
    need_scores = config.records_scores and head_scores is None
    need_record = not record_path(out, BASELINE).is_file()
    if need_scores and not need_record and config.is_generation:  # the scores alone: no generation
        head_scores = record_prompt_scores(config, model, plan, config.scores, progress)
        head_scores.save(out / SCORES_FILE)
    elif need_scores or need_record:
        result = evaluate_run(config, model, plan, None, progress=progress,
                              record=list(config.scores) if need_scores else None)
        if need_scores:
            head_scores = result.head_scores
            head_scores.save(out / SCORES_FILE)
        if need_record:
            write_json_atomic(record_path(out, BASELINE),
                              make_record(config, BASELINE, None, None, None, result, plan, model))
    return head_scores


def _local_runs(config: SweepConfig, out: Path, model, plan, thresholds, progress: bool) -> None:
    todo = pending_runs(config, out)
    static_sets = static_head_sets(config, out, model, progress) if any(
        key.endswith(STATIC_SUFFIX) for _, key, _ in todo) else {}
    total = len(config.run_ids())
    bar = tqdm(total=total, initial=total - len(todo), desc="sweep runs", unit="run", disable=not progress)
    for rid, key, q in todo:
        bar.set_postfix_str(rid)
        heads = static_sets.get(rid)
        tau = heads.threshold if heads is not None else thresholds[key].at(q)
        result = evaluate_run(config, model, plan, ablation_for(config, key, tau, heads), progress=progress)
        write_json_atomic(record_path(out, rid), make_record(config, rid, key, q, tau, result, plan, model, heads))
        bar.update(1)
    bar.close()


def calibration_plan(config: SweepConfig, model):
    """The questions static sets are chosen on: ``config.static_calibration`` = [first, end) of the
    task (of each MMLU subject), tokenized as the evaluation's."""
    from ..evaluation.registry import plan_for_task

    first, end = config.static_calibration
    plan = plan_for_task(model, config.task, subjects=config.subjects, limit=end, num_fewshot=config.num_fewshot,
                         apply_chat_template=config.apply_chat_template, source=config.source)
    position, seen = [], {}
    for req in plan.requests:  # each question's index within its subject (its split for one-subject tasks)
        position.append(seen.get(req.subject, 0))
        seen[req.subject] = position[-1] + 1
    chosen = [i for i, targets in enumerate(plan.targets) if position[targets[0][0]] >= first]
    if not chosen:
        raise UserError(f"the task has no question in static_calibration {config.static_calibration}; "
                        "choose indices below its size")
    return plan.subset(chosen)


def static_head_sets(config: SweepConfig, out: Path, model, progress: bool) -> dict[str, Any]:
    """The head set of every static run, by run id: ``static_heads`` of scores recorded (nothing
    zeroed) on the calibration questions, kept in ``static_scores.safetensors`` for resumes; the
    sets are written to ``static_heads.json`` (``HeadSet`` dicts, for export and StaticAblation)."""
    from ..pruning.static import static_heads
    from ..scoring.recording import HeadScores, record_scores

    path = out / STATIC_SCORES_FILE
    if path.is_file():
        head_scores = HeadScores.load(path)
    else:
        plan = calibration_plan(config, model)
        first, end = config.static_calibration
        head_scores = record_scores(model, plan.inputs, list(config.scores), batch_size=config.batch_size,
                                    progress=progress, description=f"{config.task} questions {first}..{end - 1} "
                                    f"(static calibration, {len(plan.inputs)} inputs)")
        head_scores.save(path)
    sets = {}
    for key in config.scores:
        for q in config.quantiles:
            if q > 0:
                sets[run_id(key + STATIC_SUFFIX, q)] = static_heads(head_scores, key, q, rule=config.static_rule)
    write_json_atomic(out / STATIC_HEADS_FILE, {rid: hs.to_dict() for rid, hs in sets.items()})
    return sets


@dataclass
class SweepResults:
    """A finished (or partial) sweep read back from its folder, ready for analysis and plots."""

    path: Path
    config: SweepConfig
    thresholds: dict[str, Thresholds]
    records: dict[str, dict[str, Any]]

    @classmethod
    def load(cls, path: str | os.PathLike) -> "SweepResults":
        path = Path(path)
        config_path = path / "sweep.json"
        if not config_path.is_file():
            raise MissingFileError(f"'{path}' is not a sweep results folder (no sweep.json); run a sweep first")
        config = SweepConfig.stored(read_sweep_json(path))
        thresholds = {}
        if (path / "thresholds.json").is_file():
            raw = json.loads((path / "thresholds.json").read_text())
            thresholds = {k: Thresholds.from_dict(v) for k, v in raw.items()}
        records = {}
        for f in sorted((path / "runs").glob("*.json")):
            rec = json.loads(f.read_text())
            check_format(rec.get("format_version", 1), f)
            records[run_id(rec["score"], rec["p"])] = rec  # folders of earlier versions: ids 'x@p=0.30'
        return cls(path, config, thresholds, records)

    @property
    def baseline_percent(self) -> float:
        """Accuracy (%) of the nothing-zeroed run."""
        if BASELINE not in self.records:
            raise UserError(f"the sweep in '{self.path}' has no baseline run yet; resume it")
        return self.records[BASELINE]["accuracy_percent"]

    @property
    def score_keys(self) -> list[str]:
        keys = []
        for rec in self.records.values():
            if rec["score"] and rec["score"] not in keys:
                keys.append(rec["score"])
        order = [k for key in self.config.scores for k in (key, key + STATIC_SUFFIX)] + ["random"]
        return sorted(keys, key=lambda k: order.index(k) if k in order else len(order))

    def curves(self, metric: str = "accuracy_percent") -> dict[str, list[tuple[float, float]]]:
        """Per score: (realized % zeroed, metric) points sorted by realized %."""
        out: dict[str, list[tuple[float, float]]] = {}
        for rec in self.records.values():
            if rec["score"]:
                out.setdefault(rec["score"], []).append((rec["realized_percent"], rec[metric]))
        return {k: sorted(out[k]) for k in self.score_keys}

    @property
    def is_complete(self) -> bool:
        return all(run_id in self.records for run_id, _, _ in self.config.run_ids())

    @property
    def scores_path(self) -> Path | None:
        """The HeadScores file recorded for calibration, or None (official thresholds, or not yet)."""
        return find_scores_file(self.path)

    def head_scores(self):
        from ..scoring.recording import HeadScores

        if self.scores_path is None:
            raise MissingFileError(f"'{self.path}' holds no recorded scores ({SCORES_FILE}); "
                                    "they exist once the baseline pass of a calibrated sweep has run")
        return HeadScores.load(self.scores_path)

    def to_dataframe(self, level: str = "runs"):
        """The records as a pandas DataFrame: ``level="runs"`` one row per run (model, task, score,
        label, p, threshold, realized %, accuracy, n, seconds, dtype, device, backend);
        ``level="questions"`` one row per run x question (subject, doc id, gold, correct,
        log-likelihoods, acc_norm correctness where the task has it)."""
        import pandas as pd

        if level not in ("runs", "questions"):
            raise UserError(f"level must be 'runs' or 'questions', got {level!r}")
        order = [rid for rid, _, _ in self.config.run_ids() if rid in self.records]
        order += [rid for rid in self.records if rid not in order]
        if level == "runs":
            rows = [{"run_id": rid, **{c: self.records[rid].get(c) for c in RUN_COLUMNS}} for rid in order]
            frame = pd.DataFrame(rows, columns=["run_id", *RUN_COLUMNS])
            frame["reused_from"] = [self.records[rid].get("reused_from") for rid in order]
            return frame
        rows = []
        for rid in order:
            rec = self.records[rid]
            n = rec["n"]
            norm = rec.get("correct_norm") or [None] * n
            for i in range(n):
                rows.append({
                    "run_id": rid, "model": rec.get("model", self.config.model), "task": rec.get("task"),
                    "score": rec["score"], "p": rec["p"], "question": i,
                    "subject": (rec.get("subjects") or [None] * n)[i],
                    "doc_id": (rec.get("doc_ids") or [None] * n)[i],
                    "gold": (rec.get("gold") or [None] * n)[i],
                    "correct": rec["correct"][i],
                    "correct_norm": norm[i],
                    "loglikelihoods": (rec.get("loglikelihoods") or [None] * n)[i],
                })
        return pd.DataFrame(rows, columns=QUESTION_COLUMNS)

    def write_tables(self) -> tuple[Path, Path]:
        """Write ``runs.parquet`` and ``questions.parquet`` (atomically) into the sweep folder."""
        from ..core.io import atomic_path

        paths = []
        for level in ("runs", "questions"):
            path = self.path / f"{level}.parquet"
            with atomic_path(path) as tmp:
                self.to_dataframe(level).to_parquet(tmp, index=False)
            paths.append(path)
        return paths[0], paths[1]

    def table(self, tolerance: int | float = 1.0):
        """The summary table, one row per score with 95 % intervals:
        :func:`inactive_heads.analysis.tables.summary_table` (the one place it is computed)."""
        from ..analysis.tables import summary_table

        return summary_table(self, tolerance)


RUN_COLUMNS = ("model", "task", "score", "label", "p", "threshold", "realized_percent", "accuracy_percent",
               "acc_norm", "n", "seconds", "dtype", "device", "backend")
QUESTION_COLUMNS = ("run_id", "model", "task", "score", "p", "question", "subject", "doc_id", "gold", "correct",
                    "correct_norm", "loglikelihoods")


def load_results(path: str | os.PathLike, level: str = "runs"):
    """A sweep folder's results as a pandas DataFrame (``level="runs"`` or ``"questions"``).

    >>> ih.load_results("results/").sort_values("accuracy_percent")    # doctest: +SKIP
    """
    return SweepResults.load(path).to_dataframe(level)


def sweep_results(path: str | os.PathLike) -> SweepResults:
    """Read a results folder written by :func:`run_sweep` (or ``inactive-heads sweep``)."""
    return SweepResults.load(path)
