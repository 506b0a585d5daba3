import os

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
