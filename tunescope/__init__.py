"""tunescope's command line: ``tunescope COMMAND`` or ``python -m tunescope COMMAND``
(`tunescope.cli`; one module per subcommand in ``tunescope/commands/``).

It stands beside the dashboard (``ui/``) over the one library (``analysis/``), which imports
neither: the commands compute with the library, and the HTML reports of ``recommend --report``
and ``claims --report`` are the dashboard's own report writers (``ui/*/report.py``, which draw
with plotly and import no streamlit).
"""
