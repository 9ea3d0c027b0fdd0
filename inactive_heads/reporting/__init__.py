"""Stage 8, reporting: plotly figures (heatmaps, curves, rankings) and the HTML / text report."""
