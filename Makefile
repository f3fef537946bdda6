# Two commands do everything on a fresh clone:
#   make demo   set up, plan the paper's headline scenario, calibrate this machine, train a
#               small model, validate predicted vs measured, write reports/ (about 6 minutes where the
#               CPU has bf16 instructions; about 10 on a 2-core AVX2 machine)
#   make test   set up, then run the test suite
# Set-up makes .venv with the CPU build of torch that this machine kind has on disk
# (TORCH=torch==2.13.0). On a GPU box, install your CUDA torch in .venv first or set TORCH.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.horizon-installed

DS_OPS := $(VENV)/.deepspeed-ops-built

.PHONY: setup demo test bench reports clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[exec,test]"
	touch $(STAMP)

demo: $(STAMP)
	@echo "== 1/6 the paper's headline: ~120B dense on one H200 with 1.5 TB host RAM, default policy"
	$(VENV)/bin/horizon plan --model dense-120b --gpu h200 --ram 1.5TB --batch 8 --seq 4096
	@echo
	@echo "== 2/6 the same with a lean host footprint, exact fp32 AdamW (split master, optimizer per layer in backward)"
	$(VENV)/bin/horizon plan --model dense-120b --gpu h200 --ram 1.5TB --batch 8 --seq 4096 \
	    --optimizer backward --grad-clip 0 --act-ckpt-on device --no-advice
	@echo
	@echo "== 3/6 calibrate this machine for the executor's CPU backend (about a minute with bf16 CPU instructions, about 2 without)"
	$(VENV)/bin/horizon calibrate -o reports/machine.toml
	@echo
	@echo "== 4/6 train a small Llama-style model for real through the streaming executor (CPU backend)"
	$(VENV)/bin/horizon train --model tiny --steps 20 --batch 4 --seq 128
	@echo
	@echo "== 5/6 predicted vs measured: fourteen configurations through the executor and the planner (2-20 min)"
	$(VENV)/bin/horizon validate --hardware reports/machine.toml --out reports
	@echo
	@echo "== 6/6 planner reports (headline, fit table, optimizer modes, checkpoints, feasibility map, scale out, against ZeRO-3 offload, host bytes)"
	$(PY) -m horizon_sim.report.build --out reports
	@echo
	@echo "== done. Reports are in reports/ (start at reports/README.md):"
	@echo "   reports/validation.md   predicted vs measured on this machine, with Gantt overlays"
	@echo "   reports/machine.toml    this machine as calibrated (horizon plan --hardware reports/machine.toml)"
	@grep -m1 '^\*\*Median' reports/validation.md | tr -d '*' | sed 's/^/   /'

# DeepSpeed compiles its CPU Adam on first use (about a minute here): done once, before the
# suite, so the suite times the tests and not a compiler (the op is kept in .venv/torch_extensions:
# horizon_exec/measure/peer_deepspeed.py extensions_dir).
$(DS_OPS): $(STAMP)
	$(PY) -c "from horizon_exec.measure.peer_deepspeed import prebuild; prebuild()" 2>&1 | grep -v WARNING || true
	touch $(DS_OPS)

test: $(STAMP) $(DS_OPS)
	$(PY) -m pytest

reports: $(STAMP)
	$(PY) -m horizon_sim.report.build --out reports

bench: $(STAMP)
	$(PY) benchmarks/sim_speed.py
	$(PY) benchmarks/exec_vs_autograd.py
	$(PY) benchmarks/soak.py
	$(PY) benchmarks/validate.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
