#!/usr/bin/env bash
# The GPU check of issue 14 on one NVIDIA H200 (under 8 minutes); --dry-run runs anywhere.
# What it checks and the bounds: benchmarks/gpu_check.py. Usage: bash benchmarks/gpu_check.sh [--dry-run]
set -euo pipefail
cd "$(dirname "$0")/.."
exec python benchmarks/gpu_check.py "$@"
