"""Framework integrations for qgpm.

Each integration lives in its own subpackage and imports its framework only when
imported itself:

* ``qgpm_integrations.langchain`` -- LangChain chat model, prompt helpers, document
  compressors and embeddings (``pip install qgpm[langchain]``).
* ``qgpm_integrations.llama_index`` -- LlamaIndex integration (``pip install qgpm[llama-index]``).
"""
