"""Figure builders: data in, plotly Figure out (one module per page)."""
