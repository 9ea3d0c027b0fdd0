"""Make the README's picture: AHON (LN) per head on SmolLM2-135M, with the heads flagged at p = 10 %.

    .venv/bin/python docs/images/make_heatmap.py            # writes docs/images/score_heatmap.{html,png}

The scores are recorded on 32 LAMBADA passages (at most 256 tokens each) in float32; τ is calibrated
at p = 10 % on the pooled (passage, layer, head) scores and the outline marks the heads whose *mean*
over the passages is below it. The PNG is a screenshot of the plotly HTML in headless Chromium
(`chromium`, which `.ci/run` installs); without Chromium only the HTML is written.
"""

import shutil
import subprocess
from pathlib import Path

import inactive_heads as ih
from inactive_heads.evaluation import texts
from inactive_heads.reporting import plots

HERE = Path(__file__).resolve().parent


def main() -> None:
    model = ih.load_model("smollm2-135m", dtype="float32", progress=False)
    passages = texts.lambada_passages(32, tokenizer=model.tokenizer, max_tokens=256)
    scores = ih.record_scores(model, passages, ["ahon_ln"], progress=False)
    tau = ih.calibrate(scores, "ahon_ln", [0.10]).at(0.10)
    fig = plots.score_heatmap(scores, "ahon_ln", threshold=tau,
                              title="AHON (LN) per head, SmolLM2-135M")
    html = HERE / "score_heatmap.html"
    fig.write_html(html, include_plotlyjs="inline", config={"displayModeBar": False})
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        print(f"wrote {html}; no chromium on PATH, so no PNG")
        return
    width = int(fig.layout.width or 900) + 40
    height = int(fig.layout.height or 900) + 40
    subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size={width},{height}", f"--screenshot={HERE / 'score_heatmap.png'}",
                    html.as_uri()], check=True, capture_output=True, timeout=120)
    html.unlink()
    print(f"wrote {HERE / 'score_heatmap.png'} (tau = {tau:.4g} at p = 0.10)")


if __name__ == "__main__":
    main()
