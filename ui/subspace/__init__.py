"""The subspace page's pieces (views/subspace.py draws the page from them)."""
