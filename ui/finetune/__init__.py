"""The finetune page's pieces (views/finetune.py draws the page from them)."""
