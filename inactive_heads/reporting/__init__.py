"""Stage 9, reporting: plotly figures (heatmaps, curves, rankings) and the HTML / text report."""
