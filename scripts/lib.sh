# Shared by the scripts: sourced, not run.

# The path of a Python 3.12 interpreter: $MRL_PYTHON, python3.12 on PATH, or a
# pyenv-installed 3.12 (uv cannot download one without GitHub).
find_python312() {
  local c
  for c in "${MRL_PYTHON:-}" "$(command -v python3.12 || true)" \
           $(ls -d "$(pyenv root 2>/dev/null || echo "$HOME/.pyenv")"/versions/3.12*/bin/python3 2>/dev/null | sort -V -r); do
    [ -n "$c" ] && [ -x "$c" ] || continue
    "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null && { echo "$c"; return 0; }
  done
  echo "no Python 3.12 found: install one (e.g. pyenv install 3.12) or set MRL_PYTHON" >&2
  return 1
}

# The tool venv's bin first on PATH: its uv and python are the ones the tool runs.
use_tool_venv() {
  local root=$1
  [ -x "$root/.venv/bin/python" ] || { echo "no tool venv at $root/.venv: run scripts/setup.sh first" >&2; exit 2; }
  export PATH="$root/.venv/bin:$PATH" UV_PYTHON_DOWNLOADS=never
}

# The upstream sources the tests build from, as MRL_SOURCES lists them
# ("NAME=PATH ..."): MRL_SOURCES itself when it is set (empty: none, so the
# PyPI stand-ins), otherwise the git repositories of the pinned commits that
# a checkout's ../shared/upstream holds (NAME.git), where it has them.
upstream_sources() {
  local root=$1 name list=""
  if [ -n "${MRL_SOURCES+set}" ]; then echo "$MRL_SOURCES"; return 0; fi
  for name in google-tunix tpu-inference vllm; do
    [ -d "$root/../shared/upstream/$name.git" ] && list+="${list:+ }$name=$(cd "$root/../shared/upstream/$name.git" && pwd)"
  done
  echo "$list"
}

# Run tests/bench/bench_NAME.py (NAME: decode, logprobs) with the arguments
# after the first three: the benchmark scripts' shared start. The python is
# the first of them when it is not an option (a path, or a name on PATH),
# else $MRL_BENCH_PYTHON, else the py312 cell venv `MRL_KEEP=1
# scripts/test-matrix.sh` keeps. PASS_PYTHON "yes" also gives the benchmark
# that python (--python PY: bench_decode starts its engines with it). The
# suite's helpers (tests/support) are imported as pytest imports them.
run_bench() {
  local root=$1 name=$2 pass_python=$3
  shift 3
  local python=${MRL_BENCH_PYTHON:-$root/build/test-matrix/cells/py312/venv/bin/python}
  case ${1:-} in -*|"") ;; *) python=$1; shift ;; esac
  python=$(command -v "$python" || echo "$python")  # a name on PATH (python3) too
  [ -x "$python" ] || { echo "bench-$name: no python at $python (give a venv's python)" >&2; exit 2; }
  local extra=()
  [ "$pass_python" = yes ] && extra=(--python "$python")
  PYTHONPATH="$root/tests${PYTHONPATH:+:$PYTHONPATH}" exec "$python" "$root/tests/bench/bench_$name.py" ${extra[@]+"${extra[@]}"} "$@"
}
