"""The layers page's pieces (views/layers.py draws the page from them)."""
