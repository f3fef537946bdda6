#!/usr/bin/env bash
# The prepared check for a GPU box lent for minutes (docs/gpu_runs.md records what it printed).
# Run from the repository root where python3's torch sees a GPU and horizon is installed
# (pip install --no-deps -e .); OUT names a folder for its files (default gpu_out). Each step
# has its own time limit and the whole check a deadline (BUDGET_S, default 480 s): a step that
# would start past it is skipped, so the check ends in time and says what it left out.
#
#   1. the CUDA tests: the executor against transformers on streams, every model family's step
#   2. horizon calibrate --device cuda (kept in the per-user cache train reads; a copy in OUT)
#   3. the job path on a full-size layer shape: tune --save-job -> train --job, 4 layers of
#      Llama-3.1-8B (hidden 4096, 32/8 heads, SwiGLU 14336, vocabulary 128256), with the run's
#      own predicted-vs-measured report
#   4. horizon train with no flags (the planner's policy, the default device) on the tiny model
#   5. benchmarks/gpu_memory_figures.py: allocated, reserved and used device memory of Horizon
#      steps beside the planner's bound (issue 44's device-memory mechanisms)
#   6. benchmarks/softcap_attention.py: Gemma 2's attention, chunked against flex_attention
#   7. benchmarks/gpu_proxy.py on the calibrated file, then the whole test suite, as time allows
set -u
OUT=${OUT:-gpu_out}
BUDGET_S=${BUDGET_S:-480}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
LOG="$OUT/log.txt"
T0=$(date +%s)

step() {  # step NAME LIMIT_S CMD...: run CMD under LIMIT_S unless the deadline is nearer
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET_S - ($(date +%s) - T0)))
  if ((left < 20)); then echo "=== $name: skipped, ${left}s left of ${BUDGET_S}s" | tee -a "$LOG"; return; fi
  ((limit > left)) && limit=$left
  echo "=== $name (limit ${limit}s, at +$(($(date +%s) - T0))s): $*" | tee -a "$LOG"
  timeout -s INT -k 10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  echo "=== $name: exit ${PIPESTATUS[0]} after +$(($(date +%s) - T0))s" | tee -a "$LOG"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
'transformers', transformers.__version__, 'gpu', torch.cuda.get_device_name())" 2>&1 | tee -a "$LOG"

step cuda-tests 150 python3 -m pytest -p no:cacheprovider -o addopts="" -q -rf -n 8 \
  tests/test_exec_cuda.py tests/test_calibrate.py -k cuda
step calibrate 100 horizon calibrate --device cuda -o "$OUT/gpu.toml"

CFG=$(mktemp -d)/llama-3.1-8b-4l.json
cat > "$CFG" <<'EOF'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
 "num_attention_heads": 32, "num_key_value_heads": 8, "num_hidden_layers": 4, "vocab_size": 128256,
 "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "rope_theta": 500000.0, "tie_word_embeddings": false,
 "hidden_act": "silu", "torch_dtype": "bfloat16"}
EOF
step tune-save-job 30 horizon tune --model "$CFG" --hardware "$OUT/gpu.toml" --batch 8 --seq 2048 --quiet \
  --save-job "$OUT/job.toml"
step train-job 150 horizon train --job "$OUT/job.toml" --steps 8 --eval-batches 1 --no-progress \
  --report-dir "$OUT/report"
step train-no-flags 60 horizon train --model tiny --steps 20 --no-progress
step memory-figures 120 python3 benchmarks/gpu_memory_figures.py "$OUT/gpu.toml" --steps 3
step softcap-attention 100 python3 benchmarks/softcap_attention.py --reps 5
step gpu-proxy 150 python3 benchmarks/gpu_proxy.py "$OUT/gpu.toml" --steps 2 --warmup 2
step whole-suite 300 python3 -m pytest -p no:cacheprovider -o addopts="" -q -rf -n 14 --maxfail=25 --timeout 120 tests
echo "=== done at +$(($(date +%s) - T0))s" | tee -a "$LOG"
