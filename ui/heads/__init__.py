"""The heads page's pieces (views/heads.py draws the page from them)."""
