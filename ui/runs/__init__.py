"""The runs page's pieces (views/runs.py draws the page from them)."""
