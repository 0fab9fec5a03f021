#!/usr/bin/env bash
# Prepares what benchmarks/gpu_check.sh installs on a GPU machine that has torch, CuPy and numba but
# not the rest of hsgds's runtime (Python 3.12, x86_64, CUDA 13), from the repo root, with network:
#
#     bash benchmarks/gpu_wheels.sh [--no-dali]
#
# .whl/   kvikio-cu13, libkvikio-cu13, rapids-logger (nvidia-cufile is in the image), zarr and its
#         deps, crc32c, tensorly (the real Indian Pines for the benchmarks) and DALI's small deps
#         (~27 MiB): carried in the call that runs the check;
# .dali/  nvidia-dali-cuda130 repacked for the GPU machine's Python: the wheel's files without the
#         extension modules of the other CPython versions, as one tar.xz (~127 MiB instead of the
#         wheel's 189 MiB; ~2 min of xz here) cut into parts of 56 MiB, with NAME, PARTS and SHA256.
#         gpu_check.sh unpacks it into its site folder (a wheel install is an unzip: the dist-info
#         travels too, so the version is still read). One call carries at most 64 MiB with the repo,
#         so the parts travel one per call, back to back while the machine stays warm (ignored files
#         already there are kept between calls), each with a cheap command (`ls -la .dali`); the call
#         that runs the check carries the last part with .whl and the three small files. The script
#         prints the carry lists.
# DALI's image codecs and nvcomp (~55 MiB) are left out: the hsgds pipelines decode no images, and a CPU
# pipeline was seen to build and run without them (a fresh venv with these wheels only).
# The pins are the versions installed here (CI's), so both machines run the same code.
# Both folders are git-ignored (.gitignore). Nothing here runs on CI.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
PLATFORMS=()
for p in manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_28_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64 any; do
    PLATFORMS+=(--platform "$p")
done
get() {  # get DIR NAME==VERSION...: wheels for the GPU machine's Python, without their dependencies
    local dir=$1
    shift
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        "${PLATFORMS[@]}" -d "$dir" "$@"
}
version() {  # the version installed here, so that the GPU machine runs what CI runs
    "$PY" -c "from importlib.metadata import version; print(version('$1'))" 2>/dev/null
}
pin() {  # pin NAME: NAME==VERSION when installed here, else NAME
    local v
    v=$(version "$1" || true)
    if [ -n "$v" ]; then echo "$1==$v"; else echo "$1"; fi
}

rm -rf .whl && mkdir -p .whl
get .whl kvikio-cu13 libkvikio-cu13 rapids-logger "$(pin zarr)" "$(pin numcodecs)" "$(pin donfig)" \
    "$(pin google-crc32c)" "$(pin crc32c)" tensorly==0.10.0
echo ".whl: $(ls .whl | wc -l) wheels, $(du -sh .whl | cut -f1)"

if [ "${1:-}" = "--no-dali" ]; then
    exit 0
fi
rm -rf .dali && mkdir -p .dali
get .dali "$(pin nvidia-dali-cuda130)"
get .whl astunparse gast libcst makefun nvtx optree  # DALI's needs that the image lacks
wheel=$(cd .dali && ls nvidia_dali_cuda130-*.whl)
dali=${wheel%%-py3-*}-cp312.tar.xz
"$PY" - ".dali/$wheel" .dali/unpacked <<'PYEOF'
import re, sys, zipfile
# keep the GPU machine's CPython 3.12 extension modules, drop the other versions' (cpython-310, -311t, ...)
other = re.compile(r"cpython-3(1[013-9]|1[0-9]t)-")
with zipfile.ZipFile(sys.argv[1]) as z:
    z.extractall(sys.argv[2], members=[n for n in z.namelist() if not other.search(n)])
PYEOF
tar -C .dali/unpacked -cf - . | xz -9 -T0 >".dali/$dali"
rm -rf .dali/unpacked ".dali/$wheel"
sha256sum ".dali/$dali" | cut -d' ' -f1 >.dali/SHA256
echo "$dali" >.dali/NAME
split -b 56M -d -a 2 ".dali/$dali" ".dali/$dali.part"
rm ".dali/$dali"
ls .dali/"$dali".part* | wc -l | tr -d ' ' >.dali/PARTS
parts=(.dali/"$dali".part*)
echo ".dali: ${#parts[@]} parts of $dali (from $wheel), $(du -sh .dali | cut -f1); .whl now $(du -sh .whl | cut -f1)"
echo "device calls, back to back:"
for part in "${parts[@]:0:${#parts[@]}-1}"; do
    echo "  carry [\"$part\"], command: ls -la .dali"
done
echo "  carry [\".whl\", \".dali/NAME\", \".dali/PARTS\", \".dali/SHA256\", \"${parts[-1]}\"]," \
     "command: bash benchmarks/gpu_check.sh \$OUT"
