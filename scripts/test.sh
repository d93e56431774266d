#!/usr/bin/env bash
# One command for a newcomer and for CI: create .venv (CPU torch), install dippm-nas[dev], run the tests.
# Extra arguments go to pytest (slow tests are excluded by default; `-m slow` runs them).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
make_venv "${DIPPM_NAS_TEST_VENV:-.venv}" "torch==2.13.0" "dev"
exec "${DIPPM_NAS_TEST_VENV:-.venv}/bin/python" -m pytest "$@"
