"""A grammar that makes small local models write DSPy's ``[[ ## field ## ]]`` output markers.

Small models drift from ChatAdapter's marker format (SmolLM2 parsed 1 answer in 5 without
it); with the grammar every model parsed 5 in 5 and accuracy did not change. llama.cpp's
server takes a GBNF grammar per request, so the LM class below adds it to each ChatAdapter
call, built from the output fields that call's prompt lists.
"""

from __future__ import annotations

import json
from typing import Any


def marker_grammar(output_fields: list[str]) -> str:
    """A GBNF grammar forcing DSPy ChatAdapter's ``[[ ## field ## ]]`` sections, in order.

    Why: small models drift from the marker format (SmolLM2 parsed 1/5 without it); with it every
    model parsed 5/5 and accuracy did not change. A field body may not
    contain "[[", so the model can only leave a section by opening the next marker.
    """
    names = list(output_fields) + ["completed"]
    rules = [f"root ::= {' '.join(f'f{i}' for i in range(len(names)))}"]
    for i, name in enumerate(names):
        header = json.dumps(f"[[ ## {name} ## ]]")
        rules.append(f'f{i} ::= {header} "\\n" body' if name != "completed" else f"f{i} ::= {header}")
    # A body starts with a real character, not "{" (small models copy ChatAdapter's "{answer}"
    # placeholder, then loop), and holds no "[" at all: SmolLM2 "closes" a section with
    # "[## ## ##]", so any "[" must be the start of the next marker. A body ends with a newline so
    # the next marker starts a line: the 0.5B model opens LaTeX display math (backslash-bracket), which without
    # it became backslash + "[[ ## answer ## ]]", a marker DSPy's ChatAdapter does not recognise.
    rules.append('body ::= [^\\[{ \\n] [^\\[]* "\\n"')
    return "\n".join(rules) + "\n"


def output_fields_from_messages(messages: list[dict[str, Any]] | None) -> list[str] | None:
    """The output field names DSPy's ChatAdapter listed in its system message, else None.

    ChatAdapter writes "Your output fields are:\\n1. `reasoning` (str): ..." and, later, the
    structure with ``[[ ## name ## ]]``. We read the numbered list (reliable, in order).
    """
    if not messages:
        return None
    first = messages[0]
    text = first.get("content") if isinstance(first, dict) else None
    if first.get("role") != "system" or not isinstance(text, str) or "Your output fields are:" not in text:
        return None
    section = text.split("Your output fields are:", 1)[1].split("\n\n", 1)[0]
    names: list[str] = []
    for line in section.splitlines():
        line = line.strip()
        if line[:1].isdigit() and "`" in line:
            names.append(line.split("`")[1])
    return names or None


def plain_lm_class():
    import dspy

    return dspy.LM


_MARKER_CLS: type | None = None


def marker_lm_class():
    """``dspy.LM`` subclass that constrains ChatAdapter calls with ``marker_grammar``.

    Why a subclass: the grammar depends on the signature being called, which only the request's
    messages reveal; calls that are not ChatAdapter-formatted (e.g. GEPA's raw reflection
    prompt) go out unconstrained.
    """
    global _MARKER_CLS
    if _MARKER_CLS is None:
        import dspy

        class MarkerGrammarLM(dspy.LM):
            def _with_grammar(self, messages: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
                fields = output_fields_from_messages(messages) if isinstance(messages, list) else None
                # JSONAdapter (ChatAdapter's fallback) asks for JSON via response_format: no markers.
                if fields and not kwargs.get("response_format"):
                    body = dict(self.kwargs.get("extra_body") or {})
                    body.update(kwargs.get("extra_body") or {})
                    body["grammar"] = marker_grammar(fields)
                    kwargs = {**kwargs, "extra_body": body}
                return kwargs

            # __call__/acall, not forward: overriding forward would take dspy 3.4 off its managed
            # (lm15) call path and warn on every call.
            def __call__(self, prompt=None, *, messages=None, **kwargs):  # type: ignore[override]
                return super().__call__(prompt, messages=messages, **self._with_grammar(messages, kwargs))

            async def acall(self, prompt=None, *, messages=None, **kwargs):  # type: ignore[override]
                return await super().acall(prompt, messages=messages, **self._with_grammar(messages, kwargs))

        _MARKER_CLS = MarkerGrammarLM
    return _MARKER_CLS
