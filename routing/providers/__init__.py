"""Answer sources that stream text: the provider seam (`base`) and its implementations.

Import the implementations from their modules (`routing.providers.openai_remote`), so that
importing the seam does not import the `openai` SDK.
"""

from routing.providers.base import (
    ChatRequest,
    Provider,
    ProviderConfig,
    ProviderError,
    ProviderErrorCode,
    StreamDone,
    StreamItem,
    TextDelta,
    Usage,
)

__all__ = [
    "ChatRequest",
    "Provider",
    "ProviderConfig",
    "ProviderError",
    "ProviderErrorCode",
    "StreamDone",
    "StreamItem",
    "TextDelta",
    "Usage",
]
