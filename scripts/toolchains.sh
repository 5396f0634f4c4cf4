#!/usr/bin/env bash
# Installs, when missing, what the device-code compile checks need, and prints the environment
# that points Calico at it (eval "$(bash scripts/toolchains.sh)"):
#   - NVRTC 13.0 + CUDA headers + cuobjdump from PyPI wheels, in .tools/venv (no GPU, no CUDA install)
#   - clang-19, lld-19 and llvm-19 from Debian, for the HIP sources (gfx90a, gfx942)
# Progress goes to stderr; only `export` lines go to stdout.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv="$root/.tools/venv"
log() { echo "toolchains: $*" >&2; }

if [[ ! -x "$venv/bin/python" ]]; then
  log "creating $venv"
  python3 -m venv "$venv" >&2
fi
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
cuda="$site/nvidia/cu13"
if [[ ! -f "$cuda/lib/libnvrtc.so.13" || ! -f "$cuda/include/cuda_bf16.h" || ! -x "$cuda/bin/cuobjdump" || ! -x "$cuda/bin/nvdisasm" ]]; then
  log "installing NVRTC, CUDA headers and cuobjdump wheels"
  "$venv/bin/pip" install -q --disable-pip-version-check \
    'nvidia-cuda-nvrtc==13.0.*' 'nvidia-cuda-runtime==13.0.*' 'nvidia-cuda-cccl==13.0.*' 'nvidia-cuda-cuobjdump>=13' 'nvidia-cuda-nvdisasm>=13' >&2
fi

if ! command -v clang-19 >/dev/null || ! command -v llvm-objdump-19 >/dev/null || ! command -v ld.lld-19 >/dev/null; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    log "installing clang-19, lld-19, llvm-19"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang-19 lld-19 llvm-19) >&2
  else
    log "clang-19/lld-19/llvm-19 missing and not root: the HIP compile checks will report themselves skipped"
  fi
fi

echo "export CUDA_HOME='$cuda'"
echo "export LD_LIBRARY_PATH='$cuda/lib'\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export PATH='$cuda/bin':\$PATH"
