"""The langchain-tests standard suites for QGPMChatModel, on the embedded SmolLM2-135M.

No context is marked in these prompts, so QGPMChatModel runs as a plain local chat
model. Feature flags are the honest ones: text in, text out; no tools, no structured
output, no multimodal inputs. ``max_tokens`` is kept small so the suite fits CI on CPU.
"""

from __future__ import annotations

import pytest
from langchain_tests.integration_tests import ChatModelIntegrationTests
from langchain_tests.unit_tests import ChatModelUnitTests

from qgpm_integrations.langchain import QGPMChatModel

from qgpm_lc_support import lc_heads

USES_REAL_MODEL = True

# The standard suites contain unmarked ``async def`` tests, written for
# ``asyncio_mode = "auto"``. This repository runs pytest-asyncio in strict mode, so the
# classes carry the asyncio mark; pytest-asyncio then warns once per *sync* test that the
# mark is unused, which is filtered here (nothing else about those tests changes).
_asyncio_suite = [
    pytest.mark.asyncio,
    pytest.mark.filterwarnings("ignore:The test <Function .*is marked with '@pytest.mark.asyncio' but it is not an async function"),
]


@_asyncio_suite[0]
@_asyncio_suite[1]
class TestQGPMChatModelUnit(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[QGPMChatModel]:
        return QGPMChatModel

    @property
    def chat_model_params(self) -> dict:
        # No max_tokens/stop here: test_standard_params passes its own.
        return {"method": "qgpm"}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False


@_asyncio_suite[0]
@_asyncio_suite[1]
class TestQGPMChatModelIntegration(ChatModelIntegrationTests):
    @property
    def chat_model_class(self) -> type[QGPMChatModel]:
        return QGPMChatModel

    @property
    def chat_model_params(self) -> dict:
        return {"method": "qgpm", "max_tokens": 10, "temperature": 0, "heads": lc_heads()}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_json_mode(self) -> bool:
        return False

    @property
    def returns_usage_metadata(self) -> bool:
        return True

    @property
    def supports_model_override(self) -> bool:
        # invoke(..., model=...) does load another model, but no second model is
        # available offline in CI, so the override tests have no value to use.
        return True

    @property
    def model_override_value(self) -> str | None:
        return None
