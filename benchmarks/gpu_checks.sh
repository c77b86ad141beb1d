#!/usr/bin/env bash
# The GPU measurements of one lent-machine call, in priority order, each step
# time-boxed so that the call ends inside its limit and returns what it measured.
#
#   OUT=/tmp/gpu bash benchmarks/gpu_checks.sh [DEADLINE_S] [STEP...]
#
# Steps (default: all, in this order): race, idle, step, tests_fast, tests_slow, idle_looped.
#   dtypes       train.py at the race's base model for 250 steps in float32, then in bfloat16
#                on the same prepared data: the dev loss at step 250 of each (the race's
#                sides at step 250: ours 5.418 in bfloat16, the peer 5.225)
#   race         benchmarks/race.py, both sides, $RACE_BUDGET s each (default 120)
#   idle         benchmarks/device_idle.py on the race's prepared corpus, scanned stacks
#   step         benchmarks/bench_train.py, bf16 base model, jax / torch eager / torch.compile
#   tests_fast   the fast tier (parity_tests and tests, -m "not slow") on the GPU,
#                $TEST_WORKERS workers (default 14)
#   tests_slow   the slow tier likewise
#   idle_looped  device_idle.py with --scan-layers off
# Needs: the corpus unpacked into .corpus/ (train/dev/test .en/.fr, ../shared/corpora's
# EN->FR Bible) and, where the image lacks them, the project's pure-Python dependencies
# as wheels in .whl/ (docs/performance.md, "On a lent GPU"). Writes under $OUT: log.txt
# (everything printed, the race's train.py log included), race_cuda.json/.md/.png, train_gpu.json/.md and junit_fast.xml,
# junit_slow.xml.
set -u
OUT=${OUT:?set OUT to the folder the results go to}
DEADLINE=$(( SECONDS + ${1:-560} )); shift || true
STEPS=${*:-race idle step tests_fast tests_slow idle_looped}
LOG=$OUT/log.txt
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
else
    export PYTHONPATH=$PWD
fi
C=.corpus
CORPUS=(--src-path $C/train.en --tgt-path $C/train.fr --dev-src-path $C/dev.en
        --dev-tgt-path $C/dev.fr --test-src-path $C/test.en --test-tgt-path $C/test.fr)
# the race's own train.py flags (race.py's run_ours), for the device-idle runs
RACE_MODEL=(--tokenizer-type bpe --vocab-size 16000 --max-len 256 --max-tokens 16384
            --d-model 512 --num-heads 8 --d-ff 2048 --layers 6 --dropout 0.1 --warmup 1000
            --label-smoothing 0.1 --dtype bfloat16 --checkpoint-every 1000000000 --beam 1
            --quiet --no-tensorboard --compile-cache /tmp/race/xla-cache
            --dev-bleu-sentences 0)

left() { echo $(( DEADLINE - SECONDS )); }
run() {  # run NAME CAP COMMAND...: time-boxed to min(CAP, what is left less 10 s)
    local name=$1 cap=$2; shift 2
    local limit=$(( $(left) - 10 < cap ? $(left) - 10 : cap ))
    if (( limit < 30 )); then echo "== $name: skipped, ${limit}s left" | tee -a "$LOG"; return; fi
    echo "== $name ($(date -u +%T), limit ${limit}s): $*" | tee -a "$LOG"
    local began=$SECONDS
    timeout --signal=INT --kill-after=15 "$limit" "$@" 2>&1 | tee -a "$LOG"
    echo "== $name: exit ${PIPESTATUS[0]} after $(( SECONDS - began ))s" | tee -a "$LOG"
}

{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm \
      --format=csv; nproc; python3 -c "import jax, torch, transformers
print('jax', jax.__version__, jax.devices(), 'torch', torch.__version__,
      'transformers', transformers.__version__)"; } 2>&1 | tee -a "$LOG"

for step in $STEPS; do
    case $step in
    race) run race 480 python3 benchmarks/race.py "${CORPUS[@]}" --device cuda \
              --time-budget "${RACE_BUDGET:-120}" --max-tokens 16384 --workdir /tmp/race \
              --out "$OUT/race_cuda.json"
          cat /tmp/race/ours.log >> "$LOG" 2>/dev/null ;;  # train.py's own lines: its compiles
    dtypes) run dtype_float32 200 python3 train.py --workdir /tmp/race/ours "${CORPUS[@]}" \
              "${RACE_MODEL[@]}" --dtype float32 --steps 250 --eval-every 250
          grep dev_loss /tmp/race/ours/metrics.jsonl | tee -a "$LOG"
          run dtype_bfloat16 150 python3 train.py --workdir /tmp/dtype-bf16 \
              --data /tmp/race/ours/data "${RACE_MODEL[@]}" --steps 250 --eval-every 250
          grep dev_loss /tmp/dtype-bf16/metrics.jsonl | tee -a "$LOG" ;;
    idle) run idle 120 python3 benchmarks/device_idle.py --first 50 --last 65 \
              --trace-dir /tmp/idle-scanned -- --data /tmp/race/ours/data \
              --workdir /tmp/idle-scanned "${RACE_MODEL[@]}" --steps 70 --eval-every 1000 ;;
    idle_looped) run idle_looped 150 python3 benchmarks/device_idle.py --first 50 --last 65 \
              --trace-dir /tmp/idle-looped -- --data /tmp/race/ours/data \
              --workdir /tmp/idle-looped "${RACE_MODEL[@]}" --steps 70 --eval-every 1000 \
              --scan-layers off ;;
    step) run step 240 python3 benchmarks/bench_train.py --dtype bfloat16 --batch-size 384 \
              --src-len 64 --tgt-len 64 --frameworks jax jax_threefry_dropout torch_eager \
              torch_compile --no-memory --out "$OUT/train_gpu.json" ;;
    tests_fast|tests_slow)  # a test stopped by the deadline still writes its junit file (SIGINT)
        tier=${step#tests_}; [[ $tier == fast ]] && marker="not slow" || marker=slow
        # deterministic reductions: the resume tests compare two runs bit for bit
        XLA_FLAGS=--xla_gpu_deterministic_ops=true XLA_PYTHON_CLIENT_PREALLOCATE=false \
            run "$step" 900 python3 -m pytest -v -rfE \
            -n "${TEST_WORKERS:-14}" -p no:cacheprovider -m "$marker" \
            --junitxml "$OUT/junit_$tier.xml" parity_tests tests ;;
    *) echo "unknown step $step" | tee -a "$LOG" ;;
    esac
done
echo "== done, $(left)s of the deadline left" | tee -a "$LOG"
