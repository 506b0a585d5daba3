import subprocess
import sys

import numpy as np

import analysis


def test_every_public_name_resolves():
    for name in analysis.__all__:
        assert getattr(analysis, name) is not None, name


def test_readme_example_runs():
    from analysis import cca_score, nu, rank_metric

    rng = np.random.default_rng(0)
    labels = np.repeat([0, 1], 100)
    states = rng.normal(size=(200, 16)) + 3.0 * labels[:, None]
    assert nu(states, labels) < 1.0
    assert 0.0 <= cca_score(states, labels) <= 1.0
    assert 1.0 <= rank_metric(states, labels) <= 16.0


def test_cli_help_does_not_import_torch():
    code = "import sys, tunescope.cli; tunescope.cli.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_layer_table_is_the_function_even_after_the_module_is_imported():
    import analysis.layers.table  # noqa: F401  (sets submodule attributes on the packages)
    from analysis import layer_table

    assert callable(layer_table) and layer_table.__name__ == "layer_metrics"


def test_json_ready_is_the_one_sanitiser():
    import json
    import math
    from pathlib import Path

    import numpy as np
    import pandas as pd

    from analysis.io import json_ready

    frame = pd.DataFrame({"a": [1.0, math.nan], "t": pd.to_datetime([0, None], unit="s", utc=True)})
    value = {1: (np.float32(0.5), np.int64(3), math.inf), "p": Path("/x"), "f": frame,
             "arr": np.array([1.5, np.nan])}  # fmt: skip
    ready = json_ready(value)
    assert ready == {"1": [0.5, 3, None], "p": "/x", "arr": [1.5, None],
                     "f": [{"a": 1.0, "t": "1970-01-01T00:00:00+00:00"}, {"a": None, "t": None}]}  # fmt: skip
    json.dumps(ready, allow_nan=False)
