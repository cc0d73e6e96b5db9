"""Reports: turn simulation results into HTML, Markdown, CSV, plots and Chrome traces."""
