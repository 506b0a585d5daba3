"""Fine-tuning runs as records: queued, trained by a worker, kept for good, compared.

- ``db``: the runs database (SQLite): every run, its per-step metrics and its result.
- ``execute``: train one recorded run and record how it ends (done, cancelled or failed).
- ``worker``: the background process that trains the queue, one per device.
- ``results``: finished runs as tables: per-run results, means over seeds, Pareto frontier.
- ``comparisons``: the runs of paper 003's comparisons and how finished runs sort into them.
- ``sequential``: the sequential rounds against full fine-tuning: statuses, the next round, the
  sentence's branch.
"""
