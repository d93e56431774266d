#!/usr/bin/env bash
# One command for a newcomer: create .venv-vision (torch + torchvision), install dippm-nas, run the main job.
# Extra arguments go to the main job.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/_venv.sh
make_venv "${DIPPM_NAS_DEMO_VENV:-.venv-vision}" "torch==2.14.1 torchvision==0.29.1" "vision,onnx,plot,demo"
exec "${DIPPM_NAS_DEMO_VENV:-.venv-vision}/bin/dippm-nas" demo "$@"
