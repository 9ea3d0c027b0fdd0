"""The notebooks run top to bottom on the built-in SmolLM2 (nbclient), and their committed copies are clean.

Each notebook is executed in a fresh ``python3`` kernel whose working directory is ``notebooks/``.
``python3`` resolves to this interpreter's ipykernel (jupyter_client swaps a kernelspec's bare
``python`` for ``sys.executable``), so the kernel sees the same virtualenv as pytest; the first
test checks that. Outputs are checked structurally (figures present, key printed lines), never
byte for byte: plotly JSON and timings change from run to run.
"""

import os
import re
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(p.name for p in NOTEBOOKS_DIR.glob("*.ipynb"))
PLOTLY = "application/vnd.plotly.v1+json"
TIMEOUT_S = 600  # per cell


def test_the_five_notebooks_exist():
    assert NOTEBOOKS == [
        "01_explore_heads.ipynb",
        "02_custom_scores_and_ablation_hooks.ipynb",
        "03_reproduce_the_paper.ipynb",
        "04_static_heads_and_pruning.ipynb",
        "05_causal_predictor.ipynb",
    ]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_committed_notebook_is_valid_and_has_no_outputs(name):
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    nbformat.validate(nb)
    assert nb.nbformat == 4
    assert nb.metadata["kernelspec"]["name"] == "python3"
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{name} cell {i} has outputs; strip them before committing"
            assert cell.execution_count is None, f"{name} cell {i} has an execution count; strip it"


def test_python3_kernel_is_this_interpreter():
    from jupyter_client.manager import KernelManager

    cmd = KernelManager(kernel_name="python3").format_kernel_cmd()
    assert os.path.realpath(cmd[0]) == os.path.realpath(sys.executable), (
        f"the 'python3' kernel runs {cmd[0]}, not this interpreter {sys.executable}; "
        "a user-level kernelspec shadows the virtualenv's (see `jupyter kernelspec list`)"
    )


def execute(name: str):
    nb = nbformat.read(NOTEBOOKS_DIR / name, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS_DIR)}},
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError, naming the cell, on the first error
    seconds = time.perf_counter() - start
    print(f"{name}: executed in {seconds:.0f} s")
    return nb


def outputs(nb):
    return [out for cell in nb.cells if cell.cell_type == "code" for out in cell.outputs]


def stdout(nb) -> str:
    return "".join(o.text for o in outputs(nb) if o.output_type == "stream" and o.name == "stdout")


def n_figures(nb) -> int:
    return sum(1 for o in outputs(nb) if o.output_type in ("display_data", "execute_result") and PLOTLY in o.data)


def n_tables(nb) -> int:
    return sum(1 for o in outputs(nb) if o.output_type == "execute_result" and "text/html" in o.data
               and "<table" in o.data["text/html"])


def no_errors(nb):
    errors = [o for o in outputs(nb) if o.output_type == "error"]
    assert not errors, f"{errors[0].ename}: {errors[0].evalue}"


def test_01_explore_heads():
    nb = execute("01_explore_heads.ipynb")
    no_errors(nb)
    text = stdout(nb)
    assert "30 layers × 9 query heads" in text
    # The most inactive head by mean AHON (LN): a real head, and below its layer's mean (LN
    # divides by the layer mean over heads, so a layer's smallest value is at most 1).
    layer, head, value = re.search(r"most inactive head: L(\d+)H(\d+), mean AHON \(LN\) ([\d.]+)", text).groups()
    assert 0 <= int(layer) < 30 and 0 <= int(head) < 9 and float(value) <= 1.0
    # |A ∩ B| / |A ∪ B| can never exceed |A ∩ B| / |A| (the share of AHON (LN)'s flags AWFT shares).
    iou_value, shared = re.search(r"IoU = ([\d.]+); AWFT also flags (\d+)%", text).groups()
    assert 0.0 <= float(iou_value) <= int(shared) / 100 + 0.005
    # heatmap, flag rates, layer profiles, ECDF, two attention patterns, output norms, IoU, Wasserstein
    assert n_figures(nb) >= 8
    assert n_tables(nb) >= 2  # the score summary and the Wasserstein table


def test_02_custom_scores_and_ablation_hooks():
    nb = execute("02_custom_scores_and_ablation_hooks.ipynb")
    no_errors(nb)
    text = stdout(nb)
    assert "by hand == StaticAblation: True" in text
    assert "hook_attn_out == b_O everywhere: True" in text
    assert "max |b_O| = 0.0   max |hook_attn_out| = 0.0" in text
    assert n_figures(nb) >= 2
    assert n_tables(nb) >= 1  # plain vs ablated evaluation


def test_03_reproduce_the_paper():
    nb = execute("03_reproduce_the_paper.ipynb")
    no_errors(nb)
    text = stdout(nb)
    assert "10 runs in" in text and "complete: True" in text
    # The baseline's accuracy is a whole number of its n questions and lies in its own interval.
    n = int(re.search(r"\((\d+) questions\)", text).group(1))
    acc, low, high = map(float, re.search(
        r"baseline accuracy \(nothing zeroed\): ([\d.]+)% \(95% interval ([\d.]+) to ([\d.]+)\)", text).groups())
    assert abs(acc * n / 100 - round(acc * n / 100)) < 0.01 and low <= acc <= high
    assert n_figures(nb) >= 1
    assert n_tables(nb) >= 3  # run records, the summary table, the official thresholds


def test_04_static_heads_and_pruning():
    nb = execute("04_static_heads_and_pruning.ipynb")
    no_errors(nb)
    text = stdout(nb)
    assert "30 layers x 9 query heads (3 KV heads)" in text
    assert "static AHON (LN) set: 81 heads" in text
    diff = float(re.search(r"max \|logit difference\| vs StaticAblation: ([\d.e+-]+)", text).group(1))
    assert diff <= 1e-4
    assert re.search(r"parameters removed: (\d+) \(accountant: \1\); equal: True", text)
    assert n_figures(nb) >= 1
    assert n_tables(nb) >= 3  # static vs dynamic, the savings table, the projections


def test_05_causal_predictor():
    nb = execute("05_causal_predictor.ipynb")
    no_errors(nb)
    text = stdout(nb)
    assert "30 layers x 9 heads" in text
    fit = re.search(r"fit split: predicted ([\d.]+)% held vs oracle ([\d.]+)%", text).groups()
    assert abs(float(fit[0]) - float(fit[1])) <= 0.5  # the decision threshold matches the oracle's fraction
    n_held = int(re.search(r"held-out: (\d+) questions", text).group(1))
    assert 15 <= n_held <= 20  # the 20 after the fit's 40, less any whose prompt is a fit question's
    for kind in ("teacher-forced", "closed loop"):
        p, r = map(float, re.search(kind + r":\s+pooled precision ([\d.]+), recall ([\d.]+)", text).groups())
        assert 0.0 <= p <= 1.0 and 0.0 <= r <= 1.0
    assert n_figures(nb) >= 1
