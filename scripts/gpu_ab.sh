#!/usr/bin/env bash
# A/B timing of the convolution kernels (issue 21): the working tree against a base commit,
# in one device call, with the microbenchmark of benchmarks/micro (e3fuse's kernels only);
# with MICRO=linear, of the linear layers (e3fuse_linear_micro / linear_micro.py, the same
# steps and summary). Both builds use the working tree's microbenchmark sources:
#
#   BASE=<commit> OUT=/path bash scripts/gpu_ab.sh
#
# 1. builds e3fuse_conv_micro of BASE (a git worktree in /tmp) and of the working tree
#    (with _core, for the model files) side by side;
# 2. runs benchmarks/micro/conv_micro.py on both executables, ROUNDS times, the order reversed
#    in even rounds (base, new, new, base, ...) so that drift of the machine affects both alike;
# 3. writes $OUT/ab_summary.md (per model and size, all layers: the median over the rounds of
#    each round's median ms, forward and backward, and new / base) and every round's JSON.
#
# With NCU=1 (NCU=both: before step 2), step 2 is instead ncu on one backward launch (layer NCU_LAYER, default 1) of
# each variant for each model of MICRO_MODELS at the first size of MICRO_SIZES: stall reasons,
# memory, scheduler and source sections and the stall reasons (cycles per issue) -> $OUT/ncu_<variant>_<model>.txt.
#
# PATCH (a file): applied to the working tree on the machine before the build (git apply), so
# that a variant can travel as a patch beside a tree that is the base. VARIANTS ("name=file
# ..."): more variants, each the working tree (with PATCH) plus its patch, built side by side
# in /tmp and timed (or profiled) as configurations of their own.
# NCU_MODELS / NCU_VARIANTS narrow the ncu runs (default: every model and configuration).
# Environment: BASE (required), OUT (default benchmarks/results/gpu_ab), ROUNDS (default 2),
# BASE_ENVS / NEW_ENVS (";"-separated settings such as E3FUSE_X=0: each is
# one more configuration, the base or new executable run under it),
# MICRO_SIZES (default "864 32000"), MICRO_MODELS (default "7net-0 7net-l3i5 mp0-medium"),
# REPEATS (per round, default 5), CUDA_ARCH (default 90). Needs .carry/reference.tar.xz
# (sevenn and mace-torch make the model files).
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUTDIR=${OUT:-$REPO/benchmarks/results/gpu_ab}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
LOG=$OUTDIR/ab.log
: >"$LOG"
# not build/gpu: the copied tree keeps this machine's build folders, and the next call's files
# (its mtimes older than these objects) would not rebuild what a PATCH changed here
BUILD=build/gpu-ab
STAGE=/tmp/e3fuse-stage
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
SUMMARY=()
# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh
[[ -n ${BASE:-} ]] || die "BASE (the commit to compare against) is required"

gpu_setup_carry
gpu_machine_info
if [[ -n ${PATCH:-} ]]; then
  git apply "$PATCH" || die "the patch $PATCH does not apply"
fi
BASE_TREE=/tmp/e3fuse-base
rm -rf "$BASE_TREE"
git worktree prune
git worktree add --detach "$BASE_TREE" "$BASE" >>"$LOG" 2>&1 ||
  die "no worktree for $BASE: the device's git holds the commits up to the session's first one, not later ones (BASE=HEAD is the working tree's base)"
base_commit=$(git -C "$BASE_TREE" rev-parse HEAD)
new_commit="$(git rev-parse HEAD)$(git diff --quiet HEAD -- kernels benchmarks/micro || echo +dirty)"
say "base $base_commit, new $new_commit"
MICRO=${MICRO:-conv}
[[ $MICRO == conv || $MICRO == linear ]] || die "MICRO must be conv or linear"
[[ ${NCU:-0} == 0 || $MICRO == conv ]] || die "NCU profiles the convolution only (MICRO=conv)"
# one measuring tool for both: the working tree's microbenchmark, built against each tree's
# kernels (with the working tree's CMakeLists.txt where the base has no target for it)
grep -qE "e3fuse_${MICRO}_micro|foreach\(micro .*\b${MICRO}\b" "$BASE_TREE/CMakeLists.txt" ||
  cp CMakeLists.txt "$BASE_TREE/"
cp benchmarks/micro/${MICRO}_micro.* benchmarks/micro/micro_common.h benchmarks/micro/micro_inputs.cuh "$BASE_TREE/benchmarks/micro/" ||
  die "cannot copy the microbenchmark into the base"
say "base built with the working tree's benchmarks/micro/${MICRO}_micro.*"
build_micro() { # tree: e3fuse_${MICRO}_micro in tree/build/gpu
  cd "$1" &&
    cmake -S . -B build/gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DE3FUSE_CUDA=ON \
      -DE3FUSE_MICROBENCH=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" \
      -DPython_EXECUTABLE="$(command -v $PY)" -Dpybind11_DIR="$($PY -m pybind11 --cmakedir)" &&
    ninja -C build/gpu "e3fuse_${MICRO}_micro"
}
declare -A EXE TREE OBJ_DIR
EXE[base]=$BASE_TREE/build/gpu/e3fuse_${MICRO}_micro
EXE[new]=$BUILD/e3fuse_${MICRO}_micro
TREE[base]=$BASE_TREE
TREE[new]=$REPO
OBJ_DIR[base]=$BASE_TREE/build/gpu
OBJ_DIR[new]=$REPO/$BUILD
variant_names=()
for spec in ${VARIANTS:-}; do
  name=${spec%%=*}
  file=$(cd "$(dirname "${spec#*=}")" && pwd)/$(basename "${spec#*=}")
  tree=/tmp/e3fuse-variant-$name
  rm -rf "$tree" && mkdir -p "$tree"
  # a copy of the working tree (untracked files included), without builds and carried data
  tar --exclude=./build --exclude=./.carry --exclude=./benchmarks/models --exclude=./.git --exclude=./.venv \
    -cf - . | tar -xf - -C "$tree" || die "no copy of the tree for variant $name"
  (cd "$tree" && git apply "$file") || die "variant $name: $file does not apply"
  EXE[$name]=$tree/build/gpu/e3fuse_${MICRO}_micro
  TREE[$name]=$tree
  OBJ_DIR[$name]=$tree/build/gpu
  variant_names+=("$name")
done
pids=()
for name in base "${variant_names[@]}"; do
  (build_micro "${TREE[$name]}") >"$OUTDIR/build_$name.log" 2>&1 &
  pids+=("$name:$!")
done
gpu_build "$BUILD" "$OUTDIR/build_new.log" -DE3FUSE_MICROBENCH=ON -- _core "e3fuse_${MICRO}_micro"
for entry in "${pids[@]}"; do
  wait "${entry#*:}" || {
    tail -30 "$OUTDIR/build_${entry%%:*}.log" | tee -a "$LOG"
    die "the build of ${entry%%:*} failed"
  }
done
for name in "${!OBJ_DIR[@]}"; do # registers and spills of the kernels timed
  echo "== $name (${TREE[$name]})" >>"$OUTDIR/resources.txt"
  # every translation unit of the timed op (conv.cu, conv_backward_f32.cu, ...)
  find "${OBJ_DIR[$name]}" -path '*e3fuse_core.dir*' -name "$MICRO*.cu.o" | sort | while read -r obj; do
    cuobjdump -res-usage "$obj" 2>&1 | grep -A1 "${MICRO}_.*_kernel" | c++filt >>"$OUTDIR/resources.txt"
  done
done

models=${MICRO_MODELS:-"7net-0 7net-l3i5 mp0-medium"}
# shellcheck disable=SC2086
$PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro; [print(n, *conv_micro.model_files(n, Path("benchmarks/models")), flush=True) for n in sys.argv[1:]]' $models 2>&1 | tee -a "$LOG"
[[ ${PIPESTATUS[0]} -eq 0 ]] || die "the model files could not be made"
if [[ ${NCU:-0} != 0 ]]; then
  read -r atoms _ <<<"${MICRO_SIZES:-32000}"
  structure=benchmarks/models/cu$atoms.bin # rattled fcc Cu, as conv_micro.py times it
  $PY -c 'import sys; from pathlib import Path; sys.path.insert(0, "benchmarks/micro"); import conv_micro as m; m.write_structure(m.structure(int(sys.argv[1])), Path(sys.argv[2]))' "$atoms" "$structure" || die "no structure file"
  for model in ${NCU_MODELS:-$models}; do
    e3f=benchmarks/models/$model.e3f
    [[ $model == mp0-medium ]] && e3f=benchmarks/models/mace-mp0-medium-random.e3f
    # shellcheck disable=SC2206
    ncu_variants=(${NCU_VARIANTS:-base new ${variant_names[*]}})
    for variant in "${ncu_variants[@]}"; do
      exe=${EXE[$variant]}
      say "ncu $variant $model $atoms atoms, backward of layer ${NCU_LAYER:-1}"
      timeout 200 ncu --kernel-name regex:conv_backward --launch-skip "${NCU_LAYER:-1}" \
        --launch-count 1 --section SpeedOfLight --section Occupancy --section LaunchStats \
        --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section ComputeWorkloadAnalysis --section InstructionStats --section SourceCounters \
        --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
        "$exe" --model "$e3f" --structure "$structure" --warmup 0 \
        --repeats 1 >"$OUTDIR/ncu_${variant}_$model.txt" 2>&1
      SUMMARY+=("$(printf '%-28s rc=%-3s' "ncu $variant $model" "$?")")
    done
  done
  if [[ $NCU != both ]]; then
    say "summary"
    printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
    exit 0
  fi
fi

# the configurations timed: base and new, and each of them again under each setting of
# BASE_ENVS / NEW_ENVS (";"-separated VAR=value, e.g. "E3FUSE_X=0")
configs=("base" "new" "${variant_names[@]}")
IFS=';' read -r -a base_envs <<<"${BASE_ENVS:-}"
IFS=';' read -r -a new_envs <<<"${NEW_ENVS:-}"
for env in "${base_envs[@]}"; do [[ -n $env ]] && configs+=("base+$env"); done
for env in "${new_envs[@]}"; do [[ -n $env ]] && configs+=("new+$env"); done
# file names of letters, digits, "_", "." and "-" only: the device tool returns no file whose
# name has others (such as the "=" and "+" of a configuration "new+VAR=value")
stem() { echo "$1" | sed 's/[^A-Za-z0-9_.-]/_/g'; }
for round in $(seq 1 "${ROUNDS:-2}"); do
  # even rounds run the configurations in reverse order (base, new / new, base): a drift of the
  # GPU's clocks over the call then falls on both sides
  order=("${configs[@]}")
  if ((round % 2 == 0)); then
    order=()
    for ((c = ${#configs[@]} - 1; c >= 0; c--)); do order+=("${configs[c]}"); done
  fi
  for config in "${order[@]}"; do
    variant=${config%%+*}
    setting=""
    [[ $config == *+* ]] && setting=${config#*+}
    exe=${EXE[$variant]}
    commit=$new_commit
    [[ $variant == base ]] && commit=$base_commit
    [[ $variant != base && $variant != new ]] && commit="$new_commit+$variant"
    say "round $round: $config"
    # shellcheck disable=SC2086
    engines=(--engines e3fuse)
    [[ $MICRO == linear ]] && engines=()
    env $setting E3FUSE_COMMIT="$commit" \
      $PY "benchmarks/micro/${MICRO}_micro.py" --exe "$exe" --models $models "${engines[@]}" \
      --sizes ${MICRO_SIZES:-864 32000} --repeats "${REPEATS:-5}" --deadline-s 600 \
      --json "$OUTDIR/$(stem "$config")_round$round.json" 2>&1 | tee -a "$LOG"
    SUMMARY+=("$(printf '%-40s rc=%-3s' "$config round $round" "${PIPESTATUS[0]}")")
  done
done

$PY - "$OUTDIR" "$base_commit" "$new_commit" "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" "$MICRO" "${configs[@]}" <<'EOF' | tee "$OUTDIR/ab_summary.md"
import json, re, statistics, sys
from pathlib import Path
out, base, new, gpu, micro = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
configs = sys.argv[6:]

def totals(doc):  # (model, atoms) -> (fwd ms, bwd ms): each layer's median, summed
    result = {}
    for row in doc["rows"]:
        layers = [layer["e3fuse"] for layer in row.get("layers", []) if "e3fuse" in layer]
        if layers and not row.get("errors"):
            result[(row["model"], row["atoms"])] = (
                sum(layer["fwd_ms"] for layer in layers), sum(layer["bwd_ms"] for layer in layers)
            )
    return result

def stem(config):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", config)

runs = {c: [totals(json.loads(p.read_text())) for p in sorted(out.glob(f"{stem(c)}_round*.json"))]
        for c in configs}
what = "Convolution" if micro == "conv" else "Linear layers"
print(f"# {what} A/B on {gpu}: base {base}, new {new}\n")
print("All layers of the model, float32" + (", radial table" if micro == "conv" else "")
      + "; per round each layer's median ms over its repeats, summed; the median over the "
      "rounds; in brackets the ratio to base (scripts/gpu_ab.sh).\n")
if micro == "linear":  # outputs' bytes: the same hashes where the sums run in the same order
    hashes = {}
    for c in configs:
        for p in sorted(out.glob(f"{stem(c)}_round*.json")):
            for row in json.loads(p.read_text())["rows"]:
                for x in row.get("layers", []):
                    key = (row["model"], row["atoms"], x["linear"])
                    e = x["e3fuse"]
                    hashes.setdefault(key, {}).setdefault(c, set()).add(
                        (e["forward_hash"], e["transpose_hash"]))
    differ = sorted(k for k, v in hashes.items() if len({h for s in v.values() for h in s}) > 1)
    print(f"Output hashes: {len(hashes) - len(differ)} of {len(hashes)} linears (model, atoms) "
          "give the same bytes in every configuration and round"
          + (": differ " + ", ".join(f"{m} {a} {n}" for m, a, n in differ) if differ else "")
          + ".\n")
for i, kind in enumerate(("forward", "backward")):
    print(f"## {kind}\n")
    print("| model | atoms | " + " | ".join(configs) + " |")
    print("|---|---:|" + "---:|" * len(configs))
    keys = sorted({k for c in configs for r in runs[c] for k in r})
    for key in keys:
        med = {}
        for c in configs:
            values = [r[key][i] for r in runs[c] if key in r]
            med[c] = statistics.median(values) if values else float("nan")
        cells = [f"{med[c]:.3f}" + ("" if c == "base" else f" ({med[c] / med['base']:.3f})")
                 for c in configs]
        print(f"| {key[0]} | {key[1]:,} | " + " | ".join(cells) + " |")
    print()
EOF
say "summary"
printf '%s\n' "${SUMMARY[@]}" | tee -a "$LOG"
