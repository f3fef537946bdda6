# Two commands do everything on a fresh clone:
#   make demo   set up, then plan the paper's headline scenario and train a small model
#   make test   set up, then run the test suite
# Set-up makes .venv with the CPU build of torch that this machine kind has on disk
# (TORCH=torch==2.13.0). On a GPU box, install your CUDA torch in .venv first or set TORCH.
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.horizon-installed

.PHONY: setup demo test bench reports clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e ".[exec,test]"
	touch $(STAMP)

demo: $(STAMP)
	@echo "== 1. the paper's headline: ~120B dense on one H200 with 1.5 TB host RAM, default policy"
	$(VENV)/bin/horizon plan --model dense-120b --gpu h200 --ram 1.5TB --batch 8 --seq 4096
	@echo
	@echo "== 2. the same with a lean host footprint (optimizer per layer in backward, no working copy)"
	$(VENV)/bin/horizon plan --model dense-120b --gpu h200 --ram 1.5TB --batch 8 --seq 4096 \
	    --optimizer backward --no-working-copy --ckpt-on device
	@echo
	@echo "== 3. train a small Llama-style model for real through the streaming executor (CPU backend)"
	$(VENV)/bin/horizon train --model tiny --steps 20 --batch 4 --seq 128

test: $(STAMP)
	$(PY) -m pytest

reports: $(STAMP)
	$(PY) -m horizon_sim.report.build --out reports

bench: $(STAMP)
	$(PY) benchmarks/sim_speed.py
	$(PY) benchmarks/exec_vs_autograd.py
	$(PY) benchmarks/soak.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
