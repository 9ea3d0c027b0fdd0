"""The docs stay true: every ```python block runs, the API reference matches the code, links resolve.

Per Markdown file in ``docs/``, the ``python`` code blocks are executed in order in one fresh
namespace (a file reads like one session), in a temporary working directory. ``load_model`` is
memoized across files (each load costs seconds; the examples never edit weights). Blocks that must not
run in tests are written as ``text``/``bash`` blocks instead. A failure names the file and the line
of the block; tracebacks point at lines of the Markdown file itself.

``docs/api.md`` is checked against the code: each ``### `name(...)` `` heading and each
``- `.method(...)` `` item must equal the signature rendered by :func:`render_signature` from the
live object, and every public name of the package must be documented.
"""

import inspect
import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)


def python_blocks(text: str) -> list[tuple[int, str]]:
    """(1-based line of the block's first code line, code) for each ```python block."""
    blocks = []
    for match in FENCE.finditer(text):
        if match.group(1) == "python":
            line = text.count("\n", 0, match.start(2)) + 1
            blocks.append((line, match.group(2)))
    return blocks


# The README is a docs page too: its notebook quickstart runs and its links resolve.
DOC_FILES = [*sorted(DOCS.glob("*.md")), DOCS.parent / "README.md"]
WITH_CODE = [p for p in DOC_FILES if python_blocks(p.read_text(encoding="utf-8"))]


_MODELS: dict = {}


@pytest.fixture
def shared_models(monkeypatch):
    """``load_model`` memoized across the doc files (same arguments, same model object): each page
    loads its model as a reader would, but the suite pays for each load once. Examples must not
    edit weights; hooks left behind are removed after each page."""
    import inactive_heads
    from inactive_heads.models import loading as models

    real = models.load_model

    def load_model(spec=models.DEFAULT_MODEL, *, backend="auto", dtype="float32", device=None, n_ctx=None,
                   n_devices=1, progress=True):
        key = (spec, backend, str(dtype).removeprefix("torch."), device, n_ctx, n_devices)
        if key not in _MODELS:
            _MODELS[key] = real(spec, backend=backend, dtype=dtype, device=device, n_ctx=n_ctx,
                                n_devices=n_devices, progress=progress)
        return _MODELS[key]

    monkeypatch.setattr(models, "load_model", load_model)
    monkeypatch.setattr(inactive_heads, "load_model", load_model)
    yield
    for model in _MODELS.values():
        model.reset_hooks(including_permanent=True)


@pytest.fixture
def restore_registry():
    """Examples may register scores and ablation kinds; the registries are put back as they were afterwards."""
    from inactive_heads.ablation import head_ablation
    from inactive_heads.scoring import scores

    saved = dict(scores._REGISTRY)
    saved_kinds = {kind: head_ablation.ablation_kind(kind) for kind in head_ablation.ablation_kinds()}
    yield
    scores._REGISTRY.clear()
    scores._REGISTRY.update(saved)
    for kind in head_ablation.ablation_kinds():
        if kind not in saved_kinds:
            head_ablation.unregister_ablation(kind)


@pytest.mark.slow
@pytest.mark.parametrize("doc", WITH_CODE, ids=lambda p: p.name)
def test_python_examples_run(doc, tmp_path, monkeypatch, restore_registry, shared_models):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    namespace = {"__name__": f"docs_{doc.stem}"}
    for line, code in python_blocks(doc.read_text(encoding="utf-8")):
        # Padding with newlines makes traceback line numbers those of the Markdown file.
        compiled = compile("\n" * (line - 1) + code, str(doc), "exec")
        try:
            exec(compiled, namespace)
        except Exception as err:
            raise AssertionError(f"{doc.name}: the example at line {line} failed: {type(err).__name__}: {err}") from err


def test_there_are_examples_to_run():
    assert len(WITH_CODE) >= 6, [p.name for p in WITH_CODE]


# ----------------------------------------------------------------------------------------------
# API reference


def _short(annotation) -> str:
    text = annotation if isinstance(annotation, str) else inspect.formatannotation(annotation)
    return re.sub(r"\b(?:[A-Za-z_]\w*\.)+([A-Za-z_]\w*)", r"\1", text)


def render_signature(obj, *, is_method: bool = False) -> str:
    """``(a, b=1, *, c=2) -> Ret``: names and defaults (no parameter types), private params and
    ``self`` dropped, module prefixes stripped from the return type; no return for classes."""
    sig = inspect.signature(obj)
    parts: list[str] = []
    star_done = False
    for i, p in enumerate(sig.parameters.values()):
        if is_method and i == 0 and p.name in ("self", "cls"):
            continue
        if p.name.startswith("_"):
            continue
        if p.kind is p.VAR_POSITIONAL:
            parts.append(f"*{p.name}")
            star_done = True
            continue
        if p.kind is p.VAR_KEYWORD:
            parts.append(f"**{p.name}")
            continue
        if p.kind is p.KEYWORD_ONLY and not star_done:
            parts.append("*")
            star_done = True
        if p.default is p.empty:
            parts.append(p.name)
        else:
            default = p.default
            text = "<factory>" if repr(default) == "<factory>" else repr(default)
            parts.append(f"{p.name}={text}")
    out = f"({', '.join(parts)})"
    if not inspect.isclass(obj) and sig.return_annotation is not sig.empty:
        out += f" -> {_short(sig.return_annotation)}"
    return out


MODULE = re.compile(r"^## .*?`(inactive_heads(?:\.\w+)*)`")
ENTRY = re.compile(r"^### `(class )?([A-Za-z_]\w*)(\(.*\)(?: -> .+?)?)?`\s*$")
MEMBER = re.compile(r"^- `\.([A-Za-z_]\w*)(\(.*?\)(?: -> [^`]+)?)?`")


def api_entries():
    """(line, module name, class name or None, member name, documented signature or None)."""
    text = (DOCS / "api.md").read_text(encoding="utf-8")
    module, cls = None, None
    for n, line in enumerate(text.splitlines(), 1):
        if m := MODULE.match(line):
            module, cls = m.group(1), None
        elif line.startswith("## "):
            module, cls = None, None
        elif m := ENTRY.match(line):
            assert module, f"api.md:{n}: entry outside a '## `inactive_heads...`' section"
            cls = m.group(2) if m.group(1) else None
            yield n, module, None, m.group(2), m.group(3)
        elif (m := MEMBER.match(line)) and cls:
            yield n, module, cls, m.group(1), m.group(2)


def test_api_reference_matches_the_code():
    import importlib

    problems = []
    for n, module_name, cls, name, documented in api_entries():
        module = importlib.import_module(module_name)
        owner = getattr(module, cls) if cls else module
        try:
            obj = inspect.getattr_static(owner, name) if cls else getattr(owner, name)
        except AttributeError:
            problems.append(f"api.md:{n}: {module_name}.{cls + '.' if cls else ''}{name} does not exist")
            continue
        if documented is None:
            continue
        if isinstance(obj, (staticmethod, classmethod)):
            target, is_method = getattr(owner, name), False
        elif cls:
            target, is_method = obj, True
        else:
            target, is_method = obj, False
        actual = render_signature(target, is_method=is_method)
        if actual != documented:
            problems.append(f"api.md:{n}: {name}{documented}\n    code: {name}{actual}")
    assert not problems, "docs/api.md is out of date:\n" + "\n".join(problems)


def test_every_public_name_is_in_the_api_reference():
    import inactive_heads
    from inactive_heads import analysis
    from inactive_heads.analysis import bootstrap, curves, heads, paired
    from inactive_heads.evaluation import texts
    from inactive_heads.reporting import plots, report

    documented = {(module, name) for _, module, cls, name, _ in api_entries() if cls is None}
    names = {("inactive_heads", n) for n in inactive_heads.__all__}
    # inactive_heads.analysis publishes the statistics of its curves, heads, bootstrap and paired modules.
    statistics = [n for m in (curves, heads, bootstrap, paired) for n in m.__all__]
    for module, public in ((analysis, statistics), (plots, plots.__all__), (report, report.__all__),
                           (texts, texts.__all__)):
        names |= {(module.__name__, n) for n in public}
    # A top-level name may be documented in its module's section instead, and the reverse.
    missing = sorted(
        f"{m}.{n}" for m, n in names
        if (m, n) not in documented and not any(n == d for _, d in documented)
    )
    assert not missing, f"not documented in docs/api.md: {missing}"


# ----------------------------------------------------------------------------------------------
# Links

LINK = re.compile(r"\]\(([^)#\s]+\.(?:md|ipynb|py))(#[\w-]+)?\)")


def _anchors(text: str) -> set[str]:
    out = set()
    for line in text.splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            title = re.sub(r"[^\w\- ]", "", title).replace(" ", "-")
            out.add(title)
    return out


@pytest.mark.parametrize("doc", DOC_FILES, ids=lambda p: p.name)
def test_relative_links_resolve(doc):
    text = doc.read_text(encoding="utf-8")
    bad = []
    for m in LINK.finditer(text):
        target, anchor = m.group(1), m.group(2)
        if "://" in target:
            continue
        path = (doc.parent / target).resolve()
        if not path.exists():
            bad.append(target)
        elif anchor and path.suffix == ".md" and anchor[1:] not in _anchors(path.read_text(encoding="utf-8")):
            bad.append(target + anchor)
    assert not bad, f"{doc.name}: broken links {bad}"


# ----------------------------------------------------------------------------------------------
# Error messages quoted in errors.md exist in the code, raised as the class the page names

ERROR_LINE = re.compile(r"^([A-Z]\w*(?:Error|Warning)): (.+)$")
CLI_ERROR = re.compile(r"^inactive-heads \w+: error: (.+)$")
NOT_OURS = ("'NoneType' object", "IProgress not found", "Inference tensors", "argument --", "arguments are required")


def _message_patterns() -> list[tuple[re.Pattern, str | None]]:
    """Every string the package builds (f-strings and "a" + "b" concatenations) as a regex whose
    placeholders match anything, with the class it is raised as when it is the message of a
    ``raise Class(...)`` (else None)."""
    import ast

    def parts(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return [node.value]
        if isinstance(node, ast.JoinedStr):
            out = []
            for value in node.values:
                out += parts(value) if isinstance(value, ast.Constant) else [None]
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return parts(node.left) + parts(node.right)
        return [None]

    patterns = []
    for path in sorted((DOCS.parent / "inactive_heads").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        raised = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                func = node.exc.func
                raised[id(node.exc.args[0])] = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        for node in ast.walk(tree):
            if isinstance(node, (ast.JoinedStr, ast.BinOp)) or (
                isinstance(node, ast.Constant) and isinstance(node.value, str)
            ):
                pieces = parts(node)
                literal = "".join(p for p in pieces if p)
                if len(literal) >= 12:
                    regex = "".join(".*?" if p is None else re.escape(p) for p in pieces)
                    patterns.append((re.compile(regex, re.S), raised.get(id(node))))
    return patterns


def test_quoted_error_messages_exist_in_the_code():
    patterns = _message_patterns()
    text = (DOCS / "errors.md").read_text(encoding="utf-8")
    missing, wrong_class = [], []
    for match in FENCE.finditer(text):
        if match.group(1) != "text":
            continue
        for line in match.group(2).splitlines():
            line = line.strip()
            if any(s in line for s in NOT_OURS):
                continue
            if m := ERROR_LINE.match(line):
                quoted_class, message = m.groups()
            elif m := CLI_ERROR.match(line):  # the command line's one-line form of a UserError
                quoted_class, message = None, m.group(1)
            elif line.startswith("inactive-heads "):
                quoted_class, message = None, line
            else:
                continue
            if quoted_class == "KeyError" and message.startswith('"') and message.endswith('"'):
                message = message[1:-1]
            classes = {raised for p, raised in patterns if p.fullmatch(message)}
            if not classes:
                missing.append(line)
            elif quoted_class and None not in classes and quoted_class not in classes:
                wrong_class.append(f"{line}\n    raised as: {', '.join(sorted(classes))}")
    assert not missing, "errors.md quotes messages the code does not produce:\n" + "\n".join(missing)
    assert not wrong_class, "errors.md names another class than the code raises:\n" + "\n".join(wrong_class)
