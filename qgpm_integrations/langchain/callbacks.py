"""``QGPMTrace``: see why QGPM answered as it did inside a chain that ends in a string.

A chain such as ``create_retrieval_chain`` or ``... | StrOutputParser()`` returns text, so
the chat model's ``response_metadata["qgpm"]`` (what was taken as context and question,
the sentences QGPM promoted, timings) never reaches the caller. Pass a :class:`QGPMTrace`
as a callback and read it afterwards::

    trace = QGPMTrace()
    out = chain.invoke({"input": question}, config={"callbacks": [trace]})
    print(trace.last["explanation"])
"""

from __future__ import annotations

import threading
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.outputs import LLMResult

__all__ = ["QGPMTrace"]


class QGPMTrace(BaseCallbackHandler):
    """Collects ``response_metadata["qgpm"]`` of every chat-model call it sees, in order.

    ``calls`` holds one dict per generation (chat models other than ``QGPMChatModel``
    give none); ``last`` is the latest or ``None``. Safe to share across threads.
    """

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    @property
    def last(self) -> dict[str, Any] | None:
        with self._lock:
            return self.calls[-1] if self.calls else None

    def on_llm_end(self, response: LLMResult, **kwargs: Any) -> None:
        for generations in response.generations:
            for g in generations:
                info = getattr(getattr(g, "message", None), "response_metadata", {}).get("qgpm")
                if info is not None:
                    with self._lock:
                        self.calls.append(info)
