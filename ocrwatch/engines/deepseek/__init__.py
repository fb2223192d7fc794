"""DeepSeek-OCR(-2) in vLLM: the engine (``engine``), how it is built and replicated (``spec``), its
options (``options``), the batched vision encoder and the vLLM plugin that installs it (``encoder``,
``plugin``), the no-repeat n-gram guard (``ngram``, ``ngram_vllm``), the parser of the model's
grounding tags (``grounding``) and the page ladder's rungs and judge (``rungs``).

Nothing is imported here: ``config`` imports ``options``, which must not pull in the rest.
"""
