# make demo / make test create or reuse .venv/ and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
# Pinned for this machine: a CUDA build that runs on CPU and ships Triton.
TORCH_PINS := torch==2.14.1 torchvision==0.29.1

.PHONY: install demo test fuzz docs dist lint clean bench-balance bench-plan bench-compression bench-kernels bench-bert bench-hybrid gpu-check

install: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH_PINS)
	$(BIN)/pip install -q -e '.[recipes,dev,docs]'
	touch $(STAMP)

# The README's demo figures are this result: benchmarks/results/demo.json (+ demo.png), committed.
demo: install
	$(BIN)/hetero-strategy demo --out benchmarks/results

test: install
	$(BIN)/ruff check src tests triton_kernels benchmarks recipes
	TRITON_INTERPRET=1 $(BIN)/python -m pytest -q tests

# Property-based fuzzing of every input a user can type (issue 31): 5000 generated cases per surface
# (config keywords, YAML, profile JSON, CLI), a fresh random seed each run; a benchmark-sized job, not
# part of `make test` (which runs a fixed-seed subset of the same tests). FUZZ_EXAMPLES=N to resize.
FUZZ_EXAMPLES ?= 5000
fuzz: install
	HETERO_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) flock /tmp/hetero_cpu.lock $(BIN)/python -m pytest -q -p no:cacheprovider \
		--timeout 3600 --durations=0 tests/test_fuzz_config.py tests/test_fuzz_profile.py tests/test_fuzz_cli.py

# The docs site (mkdocs-material + mkdocstrings); --strict turns broken links and docstrings into errors.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# The sdist and the wheel that `pip install hetero-strategy` gets, in dist/ (tests/test_wheel.py builds
# the same and installs it into a fresh venv). The wheel is built from the sdist, so both are checked.
dist: install
	rm -rf dist build
	$(BIN)/python -m build --outdir dist

# Benchmarks (not tests): the emulated-cluster ones need root; bench-kernels needs a CUDA GPU.
bench-balance: install
	flock /tmp/hetero_cpu.lock $(BIN)/hetero-strategy bench balance --rounds 5 --sweep --json benchmarks/results/balance.json
	flock /tmp/hetero_cpu.lock $(BIN)/hetero-strategy bench balance --compute 0.5,0.45,0.3,0.25 --batch 32 \
		--model resnet18_l3 --framework ddp --trainings ddp,hetero --json benchmarks/results/balance_4rank.json
	flock /tmp/hetero_cpu.lock $(BIN)/hetero-strategy bench balance --compute 0.5,0.45,0.3,0.25 \
		--link 10gbit,10gbit,1gbit,100mbit --batch 32 --model resnet18_l3 --framework ddp \
		--trainings ddp,ddp_powersgd,hetero_tiered --steps 12 --json benchmarks/results/balance_4rank_mixed.json
	flock /tmp/hetero_cpu.lock $(BIN)/hetero-strategy bench lengths --json benchmarks/results/lengths.json

# The planner against the emulator (issue 30): profile, predict and measure on 3 emulated clusters, ~10 min.
bench-plan: install
	flock /tmp/hetero_cpu.lock $(BIN)/hetero-strategy bench plan --json benchmarks/results/plan.json

bench-compression: install
	$(BIN)/hetero-strategy bench compression --json benchmarks/results/compression.json

bench-bert: install
	flock /tmp/hetero_cpu.lock $(BIN)/python benchmarks/bench_bert_recipe.py --steps 200 --json benchmarks/results/bert_recipe.json
	flock /tmp/hetero_cpu.lock $(BIN)/python benchmarks/bench_bert_recipe.py --steps 60 --json benchmarks/results/bert_recipe_60.json
	flock /tmp/hetero_cpu.lock $(BIN)/python benchmarks/bench_bert_recipe.py --steps 30 --json benchmarks/results/bert_recipe_30.json

bench-hybrid: install
	flock /tmp/hetero_cpu.lock $(BIN)/hetero-strategy bench hybrid --json benchmarks/results/hybrid.json

bench-kernels: install
	$(BIN)/python benchmarks/bench_kernels.py --json benchmarks/results/kernels.json

# Everything that needs a GPU, in one run and one JSON (under 5 minutes on a lent GPU).
gpu-check: install
	$(BIN)/python benchmarks/gpu_check.py --json benchmarks/results/gpu_check.json

lint: install
	$(BIN)/ruff check src tests triton_kernels benchmarks recipes

clean:
	rm -rf $(VENV) build dist site *.egg-info src/*.egg-info
