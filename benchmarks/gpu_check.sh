#!/usr/bin/env bash
# The GPU check, in one call on a GPU machine, from the repo root:
#
#     bash benchmarks/gpu_check.sh OUTDIR
#
# (a) installs the wheels shipped beside the repo into /tmp/site: .whl/*.whl (kvikio, libkvikio,
#     rapids-logger, crc32c, zarr & co., tensorly, and DALI's small deps), and DALI when every part of
#     its split archive is in .dali/ (.dali/NAME = the archive's name: DALI's files repacked as a
#     .tar.xz, unpacked into /tmp/site, or a wheel; .dali/PARTS = part count, .dali/SHA256).
#     benchmarks/gpu_wheels.sh makes both folders and prints which call carries what (a part per
#     call, over successive calls while the machine stays warm: ignored files already there are kept);
# (b) keeps cuFile's log in OUTDIR/cufile.log;
# (c) writes the device report (hsgds.probe.probe + hsgds.doctor.doctor_report) to OUTDIR/doctor.txt;
# (d) runs the GPU tests: pytest -m gpu ... --junitxml=OUTDIR/gpu_tests.xml on the test files that hold
#     GPU tests (the image lacks the test extras that other test files import, e.g. SPy and rasterio);
# (e) runs the GPU benchmarks in the order of BENCHES below (most needed first: a step that finds too
#     little time left is skipped), each one's JSON into OUTDIR/benchmarks.tar.gz as NAME.json;
# (f) writes OUTDIR/summary.json: per-step status and seconds, test counts and failures, versions, GPU,
#     and every benchmark's JSON.
#
# It never stops at the first failure, and every step's timeout is cut to the time left, so the whole run
# ends within GPU_CHECK_BUDGET_S seconds (default 420). GPU_CHECK_BENCHES=name,name runs only those
# benchmarks (a short rerun). OUTDIR stays flat with at most 8 files:
# gpu_check.log doctor.txt gpu_tests.xml benchmarks.tar.gz summary.json cufile.log.
set -u
shopt -s nullglob

if [ $# -ne 1 ]; then
    echo "usage: bash benchmarks/gpu_check.sh OUTDIR" >&2
    exit 2
fi
mkdir -p "$1" || exit 2
OUT=$(cd "$1" && pwd)
SITE=${GPU_CHECK_SITE:-/tmp/site}  # override only to simulate the check elsewhere
WORK=$(mktemp -d /tmp/hsgds-gpu-check.XXXXXX)  # scratch that must not land in OUTDIR
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET_S:-420}
RESERVE=25  # seconds kept for the summary

export CUFILE_LOGFILE_PATH="$OUT/cufile.log"
export PYTHONPATH="$SITE:$PWD"
# the checkout is imported in place, not installed: hsgds.preprocess (installed from the top-level
# preprocess/ by pyproject's package-dir) needs a link inside hsgds/, made here and removed at the end
LINKED=""
if [ ! -e hsgds/preprocess ]; then
    ln -s ../preprocess hsgds/preprocess && LINKED=hsgds/preprocess
fi
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1

left() { echo $((T0 + BUDGET - $(date +%s))); }

# step NAME MAX_SECONDS CMD...: run CMD under a timeout cut to the time left; record status and seconds
step() {
    local name=$1 max=$2 t rc start
    shift 2
    t=$(( $(left) - RESERVE ))
    [ "$t" -gt "$max" ] && t=$max
    if [ "$t" -lt 5 ]; then
        echo "== $name: skipped, out of time"
        printf '%s\t%s\t%s\t%s\n' "$name" skipped 0 "out of time" >>"$WORK/steps.tsv"
        return 0
    fi
    echo "== $name (timeout ${t}s): $*"
    start=$(date +%s%N)
    timeout -k 5 "$t" "$@"
    rc=$?
    local secs status=ok
    secs=$(awk -v a="$start" -v b="$(date +%s%N)" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=timeout; elif [ $rc -ne 0 ]; then status=failed; fi
    echo "== $name: $status (rc=$rc, ${secs}s)"
    printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$secs" "rc=$rc" >>"$WORK/steps.tsv"
    return 0
}

note() {  # note NAME STATUS DETAIL: record a step that did not run
    echo "== $1: $2 ($3)"
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" 0 "$3" >>"$WORK/steps.tsv"
}

# an array, not a function: `timeout` runs programs only
PIP_TARGET=(python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE")

join_dali() {  # reassemble DALI's split archive into $WORK; prints its path
    local name parts want
    name=$(cat .dali/NAME)
    parts=(.dali/"$name".part*)
    want=$(cat .dali/PARTS 2>/dev/null || echo "${#parts[@]}")
    if [ "${#parts[@]}" -eq 0 ] || [ "${#parts[@]}" -ne "$want" ]; then
        echo "DALI: ${#parts[@]} of $want parts of $name present" >&2
        return 3
    fi
    cat "${parts[@]}" >"$WORK/$name" || return 4
    if [ -f .dali/SHA256 ] && ! echo "$(cat .dali/SHA256)  $WORK/$name" | sha256sum -c --quiet; then
        echo "DALI: $name reassembled with a wrong sha256" >&2
        return 4
    fi
    echo "$WORK/$name"
}

main() {
    echo "gpu_check: $(date -u +%FT%TZ) in $PWD -> $OUT (budget ${BUDGET}s)"
    : >"$WORK/steps.tsv"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$WORK/smi.txt" 2>&1 \
        || echo "nvidia-smi failed" >>"$WORK/smi.txt"
    cat "$WORK/smi.txt"
    mkdir -p "$SITE"

    # (a) wheels, in ONE pip call: with --target, a second call would replace whole top-level folders
    # (nvidia/) that the first one wrote
    local wheels=(.whl/*.whl) dali="" extra=()
    if [ -f .dali/NAME ]; then
        if dali=$(join_dali); then
            extra=(.dali/*.whl)
            case $dali in *.whl) extra+=("$dali") ;; esac
        else
            dali=""
            note install_dali incomplete "see the log: parts missing or damaged"
        fi
    else
        note install_dali absent "no .dali/NAME"
    fi
    if [ "${#wheels[@]}" -eq 0 ] && [ "${#extra[@]}" -eq 0 ]; then
        note install_wheels missing "no .whl/*.whl: kvikio will not be importable"
    else
        [ "${#wheels[@]}" -eq 0 ] && echo "no .whl/*.whl: kvikio will not be importable"
        step install_wheels 180 "${PIP_TARGET[@]}" "${wheels[@]}" "${extra[@]}"
    fi
    if [ -n "$dali" ] && [ "${dali%.whl}" != "$dali" ]; then  # a wheel: installed by that pip call
        if [ "$(tail -n 1 "$WORK/steps.tsv" | cut -f2)" != ok ] && [ "${#wheels[@]}" -gt 0 ]; then
            note install_dali failed "the install with DALI failed; retrying without it"
            step install_wheels_no_dali 90 "${PIP_TARGET[@]}" "${wheels[@]}"
        else
            note install_dali ok "installed with the wheels"
        fi
    elif [ -n "$dali" ]; then
        # unpacked after pip: its --target install would replace the nvidia/ folder this adds to
        step install_dali 90 tar -xJf "$dali" -C "$SITE"
    fi
    if [ -d "$SITE" ]; then
        rm -f "$dali"
        # a regular `nvidia` package (with __init__.py) further down the path hides $SITE/nvidia (DALI,
        # cuFile): make ours a package that extends its path over every nvidia/ folder on sys.path
        if [ -d "$SITE/nvidia" ] && [ ! -f "$SITE/nvidia/__init__.py" ] && ! python3 -c "
import nvidia, sys
sys.exit(0 if any(p.startswith('$SITE') for p in nvidia.__path__) else 1)" 2>/dev/null; then
            echo "__path__ = __import__('pkgutil').extend_path(__path__, __name__)" >"$SITE/nvidia/__init__.py"
            echo "made $SITE/nvidia a package extending its path (a regular nvidia package hid it)"
        fi
    fi

    # (c) the device report
    step doctor 90 python3 - "$OUT/doctor.txt" "$WORK/probe.json" <<'EOF'
import json, sys, time
t = time.time()
from hsgds.doctor import doctor_report
from hsgds.probe import probe
report = probe()
text = doctor_report(report) + f"\n(probe took {time.time() - t:.2f} s)\n"
with open(sys.argv[1], "w") as f:
    f.write(text)
with open(sys.argv[2], "w") as f:
    json.dump(report.as_dict(), f, indent=1)
print(text)
EOF

    # (d) the GPU tests, from the files that hold some
    local files
    mapfile -t files < <(grep -rl --include='*.py' -e 'mark\.gpu' tests | sort)
    step gpu_tests 240 python3 -m pytest -m gpu -q -p no:cacheprovider \
        -o junit_family=xunit2 --junitxml="$OUT/gpu_tests.xml" "${files[@]}"

    # (e) GPU benchmarks: NAME, seconds at most, command ($J: where its JSON goes; logs go to stderr)
    mkdir -p "$WORK/bench"
    local benches line name limit cmd
    mapfile -t benches <<'BENCHES'
bench_verify|75|exec python3 benchmarks/bench_verify.py >"$J"
bench_loader|150|exec python3 benchmarks/bench_loader.py >"$J"
bench_loader_batch4096|75|exec python3 benchmarks/bench_loader.py --contenders kvikio_zarr,hsgds --batch 4096 --e2e-steps 0 --repeats 3 >"$J"
bench_engines|45|exec python3 benchmarks/bench_engines.py >"$J"
bench_loader_fast_model|60|exec python3 benchmarks/bench_loader.py --scenes indian_pines --contenders hsgds --e2e-contenders hsgds --e2e-model SpectralSpatialCNN --dtypes float32 --batches 10 --e2e-steps 200 >"$J"
bench_augment|60|exec python3 benchmarks/bench_augment.py --device cuda --epochs 5 --json "$J"
bench_predict|100|exec python3 benchmarks/bench_predict.py --quick >"$J"
BENCHES
    for line in "${benches[@]}"; do
        IFS='|' read -r name limit cmd <<<"$line"
        if [ -n "${GPU_CHECK_BENCHES:-}" ] && [[ ",$GPU_CHECK_BENCHES," != *",$name,"* ]]; then
            continue  # a short rerun names the benchmarks it needs
        fi
        step "$name" "$limit" env J="$WORK/bench/$name.json" bash -c "$cmd"
    done
    tar -czf "$OUT/benchmarks.tar.gz" -C "$WORK/bench" . || echo "tar of the benchmarks' JSON failed"

    # (f) the summary
    python3 - "$OUT" "$WORK" "$T0" <<'EOF' || echo "{\"ok\": false, \"error\": \"summary failed\"}" >"$OUT/summary.json"
import json, os, platform, sys, time
import xml.etree.ElementTree as ET
from importlib import metadata

out, work, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
steps = {}
with open(os.path.join(work, "steps.tsv")) as f:
    for line in f:
        name, status, secs, detail = (line.rstrip("\n").split("\t") + ["", "", ""])[:4]
        steps[name] = {"status": status, "seconds": float(secs or 0), "detail": detail}

tests = {"total": 0, "passed": 0, "failed": 0, "errors": 0, "skipped": 0, "seconds": 0.0}
problems, skips = [], {}
junit = os.path.join(out, "gpu_tests.xml")
if os.path.exists(junit):
    try:
        for case in ET.parse(junit).getroot().iter("testcase"):
            tests["total"] += 1
            tests["seconds"] += float(case.get("time") or 0)
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            kinds = {child.tag: child for child in case}
            if "failure" in kinds or "error" in kinds:
                tag = "failure" if "failure" in kinds else "error"
                tests["failed" if tag == "failure" else "errors"] += 1
                msg = (kinds[tag].get("message") or kinds[tag].text or "").strip().splitlines()
                problems.append({"test": name, "kind": tag, "message": (msg[0] if msg else "")[:400]})
            elif "skipped" in kinds:
                tests["skipped"] += 1
                why = (kinds["skipped"].get("message") or "").strip()[:200]
                skips[why] = skips.get(why, 0) + 1
            else:
                tests["passed"] += 1
        tests["seconds"] = round(tests["seconds"], 2)
    except ET.ParseError as exc:
        problems.append({"test": "gpu_tests.xml", "kind": "unreadable", "message": str(exc)})

report = {}
try:
    with open(os.path.join(work, "probe.json")) as f:
        report = json.load(f)
except (OSError, ValueError):
    pass

versions = {"python": platform.python_version()}
for dist in ("torch", "numpy", "kvikio-cu13", "libkvikio-cu13", "nvidia-cufile", "cupy-cuda13x",
             "nvidia-dali-cuda130", "zarr", "crc32c", "pytest"):
    try:
        versions[dist] = metadata.version(dist)
    except metadata.PackageNotFoundError:
        versions[dist] = None

benches = {}
bench_dir = os.path.join(work, "bench")
for name in sorted(os.listdir(bench_dir)) if os.path.isdir(bench_dir) else []:
    b = name.removesuffix(".json")
    benches[b] = {"step": steps.get(b, {}).get("status"), "json": f"benchmarks.tar.gz:{name}"}
    try:  # copied in, so that one file tells all
        with open(os.path.join(bench_dir, name)) as f:
            benches[b]["result"] = json.load(f)
    except ValueError as exc:
        benches[b]["result"] = f"unreadable JSON: {exc}"

with open(os.path.join(work, "smi.txt")) as f:
    smi = f.read().strip()
installs_ok = "ok" in (steps.get("install_wheels", {}).get("status"),
                      steps.get("install_wheels_no_dali", {}).get("status"))
summary = {
    # all skipped is not a pass: on the GPU machine it means CUDA or kvikio was not seen
    "ok": installs_ok and tests["passed"] > 0 and tests["failed"] == 0 and tests["errors"] == 0
          and steps.get("gpu_tests", {}).get("status") == "ok",
    "seconds": round(time.time() - t0, 1),
    "gpu": smi,
    "steps": steps,
    "tests": tests,
    "problems": problems[:40],
    "skip_reasons": skips,
    "device": {k: report.get(k) for k in ("cuda", "device_name", "cuda_driver", "cuda_runtime",
                                          "kvikio_usable", "kvikio_reason", "gds", "gds_reason",
                                          "compat_mode", "dali_gpu", "dali_reason",
                                          "wsl", "probe_error")},
    "versions": versions,
    "benchmarks": benches,
    "files": sorted(os.listdir(out)) + ["summary.json"],
}
with open(os.path.join(out, "summary.json"), "w") as f:
    json.dump(summary, f, indent=1)
print(json.dumps({k: summary[k] for k in ("ok", "seconds", "tests")}))
EOF
    echo "gpu_check: done in $(( $(date +%s) - T0 ))s; files: $(ls "$OUT" | tr '\n' ' ')"
}

main 2>&1 | tee "$OUT/gpu_check.log"
rm -rf "$WORK"
[ -n "$LINKED" ] && rm -f "$LINKED"
exit 0
