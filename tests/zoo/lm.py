"""ZooLM: one small deterministic fake model that answers any DSPy signature, through any adapter.

The task is addition ("What is 17 + 25?"). The model slips (answers one too many) when the sum is a
multiple of 3, unless the instruction in its system prompt carries ``CAREFUL``, the sentence every
reflection reply adds: so every program's seed scores strictly between 0 and 1, and optimisation can
reach 1. It reads the prompts DSPy's ChatAdapter, JSONAdapter, XMLAdapter and TwoStepAdapter write,
fills every output field by the type the system message declares (str, int, float, bool, Literal,
list, dict, pydantic models by their JSON schema), plays the tool loops of dspy.ReAct and dspy.ReActV2
(one tool call, then ``finish`` or ``submit``), and answers the reflection prompts (GEPA's instruction proposer, dspy_pxn's sibling
merge, dspy.Flex's code proposer) by echoing the current instruction or code plus ``CAREFUL``.

Every reply is a pure function of the prompt's text, never of call order or threads, so dspy.GEPA
and BatchedGEPA see the same seed scores. ``fault`` makes the model misbehave on a fixed subset of
questions (``faulty``): "malformed" replies no adapter can parse, "error" raises ``InjectedLMError``.
"""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from typing import Any, Literal

from dspy.lm15 import TextPart

from dspy_pxn.testing import SimulatedLM
from dspy_pxn.testing.simulated_lm import _AsyncSimEngine, _SimEngine

CAREFUL = "Double-check the arithmetic."
QUESTION = re.compile(r"What is (\d+) \+ (\d+)\?")
Fault = Literal["malformed", "error"]

_OUTPUTS = re.compile(
    r"(?:Your output fields are|Your outputs must contain):\n(.*?)(?=\nAll interactions|\nYou should lay out|\Z)", re.DOTALL)
_INPUTS = re.compile(r"(?:Your input fields are|As input, you will be provided with):\n(.*?)(?=\nYour output|\Z)", re.DOTALL)
_FIELD = re.compile(r"^\d+\. `(\w+)` \((.*?)\):", re.MULTILINE)
_SECTION = re.compile(r"\[\[ ## (\w+) ## \]\]\n?(.*?)(?=\[\[ ## \w+ ## \]\]|\Z)", re.DOTALL)
_XML_FIELD = re.compile(r"<(\w+)>\n?(.*?)\n?</\1>", re.DOTALL)
_ADAPTER_TAIL = re.compile(r"\n\s*\nRespond with [^\n]*\s*\Z")
_SCHEMA_NOTE = "# note: the value you produce must adhere to the JSON schema: "
_JSON_STRUCTURE = "Outputs will be a JSON object with the following fields.\n\n"
_TWO_STEP_MAIN = "You are a helpful assistant that can solve tasks based on user input."
_TWO_STEP_EXTRACTION = "Your job is to extract the fields from the text verbatim."
_ANSWER_WORDS = ("answer", "result", "total", "sum", "value")


class InjectedLMError(RuntimeError):
    """The failure ``ZooLM(fault="error")`` raises: an LM outage on some inputs, not all."""


def slips(a: int, b: int) -> bool:
    """The questions a careless model gets wrong."""
    return (a + b) % 3 == 0


def faulty(a: int, b: int) -> bool:
    """The questions a faulty model (``fault=``) misbehaves on."""
    return a % 5 == 0


@dataclass(frozen=True)
class Facts:
    """What the model makes of the question: its addends and the total it (maybe wrongly) computes."""

    a: int
    b: int
    answer: int

    @property
    def sentence(self) -> str:
        return f"{self.a} + {self.b} = {self.answer}."


@dataclass(frozen=True)
class Prompt:
    """The text of a DSPy call: the system message, the last user message (the current input), and the
    earlier user messages (demos, history, an agent's earlier turns)."""

    system: str
    user: str
    earlier: tuple[str, ...] = ()

    @property
    def two_step_main(self) -> bool:
        return self.system.startswith(_TWO_STEP_MAIN)

    @property
    def json_mode(self) -> bool:
        return _JSON_STRUCTURE in self.system

    @property
    def xml_mode(self) -> bool:
        return "wrapped in XML tags" in self.user

    def outputs(self) -> list[tuple[str, str]]:
        """(name, type as DSPy prints it) of each output field the system message declares."""
        m = _OUTPUTS.search(self.system)
        return _FIELD.findall(m.group(1)) if m else []

    def inputs(self) -> dict[str, str]:
        """The current input's field values, as the adapter wrote them."""
        if self.two_step_main:
            m = _INPUTS.search(self.system)
            return _labelled(self.user, [name for name, _ in _FIELD.findall(m.group(1))] if m else [])
        if self.xml_mode:
            return {k: v.strip() for k, v in _XML_FIELD.findall(self.user)}
        return {k: _ADAPTER_TAIL.sub("", v).strip() for k, v in _SECTION.findall(self.user)}

    def facts(self) -> Facts | None:
        """The current question's facts; an agent's later turn carries it in an earlier message."""
        m = next(filter(None, (QUESTION.search(text) for text in (self.user, *reversed(self.earlier)))), None)
        if not m:
            return None
        a, b = int(m.group(1)), int(m.group(2))
        careless = slips(a, b) and CAREFUL not in self.system
        return Facts(a, b, a + b + careless)


def _labelled(text: str, names: list[str]) -> dict[str, str]:
    """Values of a ``name: value`` text (TwoStepAdapter's format), a value running to the next known name."""
    if not names:
        return {}
    heads = re.compile(rf"^({'|'.join(map(re.escape, names))}): ?", re.MULTILINE)
    marks = list(heads.finditer(text))
    ends = [m.start() for m in marks[1:]] + [len(text)]
    return {m.group(1): text[m.end():end].strip() for m, end in zip(marks, ends)}


# --------------------------------------------------------------------------- types -> values
def _split_top(text: str) -> list[str]:
    """``"str, list[int]"`` -> ``["str", "list[int]"]``: commas outside brackets only."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()]


def _schema_of(type_text: str, prompt: Prompt, name: str) -> dict[str, Any]:
    """A JSON schema for a type as DSPy prints it (``int``, ``Literal['a', 'b']``, ``list[str]``, a model)."""
    simple = {"str": "string", "int": "integer", "float": "number", "bool": "boolean"}
    if type_text in simple:
        return {"type": simple[type_text]}
    head, _, rest = type_text.partition("[")
    inner = _split_top(rest[:-1]) if rest else []
    if head == "Literal":
        return {"enum": ast.literal_eval(f"[{rest[:-1]}]")}
    if head == "list":
        return {"type": "array", "items": _schema_of(inner[0], prompt, name) if inner else {}}
    if head == "dict":
        return {"type": "object", "additionalProperties": _schema_of(inner[1], prompt, name) if inner else {}}
    if type_text == "Any":
        return {}
    return _printed_schema(name, prompt.system) or {"type": "string"}


def _printed_schema(name: str, system: str) -> dict[str, Any] | None:
    """The JSON schema DSPy prints after ``{name}`` for a structured output field (escaped in JSON mode)."""
    texts = [system]
    if (at := system.find(_JSON_STRUCTURE)) >= 0:
        try:
            structure, _ = json.JSONDecoder().raw_decode(system, at + len(_JSON_STRUCTURE))
            texts.insert(0, "\n".join(map(str, structure.values())))
        except json.JSONDecodeError:
            pass
    marker = "{" + name + "}"
    for text in texts:
        for m in re.finditer(re.escape(marker) + r" *" + re.escape(_SCHEMA_NOTE), text):
            try:
                return json.JSONDecoder().raw_decode(text, m.end())[0]
            except json.JSONDecodeError:
                continue
    return None


def _answer_like(name: str) -> bool:
    return any(word in name for word in _ANSWER_WORDS)


def _terms(facts: Facts) -> dict[str, int]:
    return {"a": facts.a, "b": facts.b, "sum": facts.answer}


def _value(schema: dict[str, Any], name: str, facts: Facts, defs: dict[str, Any]) -> Any:
    """A plausible value of ``schema`` for a field called ``name``, carrying the model's answer."""
    if ref := schema.get("$ref"):
        schema = defs[ref.rsplit("/", 1)[-1]]
    if choices := schema.get("anyOf"):
        schema = next((s for s in choices if s.get("type") != "null"), choices[0])
    if "enum" in schema:
        options = schema["enum"]
        return str(facts.answer) if str(facts.answer) in options else options[facts.answer % len(options)]
    kind = schema.get("type")
    if kind == "object":
        if props := schema.get("properties"):
            return {key: _value(sub, key, facts, defs) for key, sub in props.items()}
        item = schema.get("additionalProperties")  # the addends and the total, by name
        item = item if isinstance(item, dict) else {}
        return {key: _value(item, "value", Facts(facts.a, facts.b, n), defs) for key, n in _terms(facts).items()}
    if kind == "array":
        item = schema.get("items") or {}  # the addends, then the total
        return [_value(item, "value", Facts(facts.a, facts.b, n), defs) for n in _terms(facts).values()]
    if kind == "integer":
        return facts.answer
    if kind == "number":
        return float(facts.answer)
    if kind == "boolean":
        return facts.answer % 2 == 0
    return str(facts.answer) if _answer_like(name) else facts.sentence


# --------------------------------------------------------------------------- ReAct
def _tool_choice(tools: list[str], done: str, observed: bool) -> str:
    """An agent's loop: call the first tool, and once its result is in, the tool ``done`` (finish, submit)."""
    others = [tool for tool in tools if tool != done]
    return done if observed or not others else others[0]


def _tool_args(tool: str, prompt: Prompt, facts: Facts) -> dict[str, Any]:
    """Arguments for ``tool`` by the schema the agent prints ("It takes arguments {...}."): numbers take the
    addends in order, an answer-like argument (submit's outputs) the model's answer."""
    text = "\n".join((prompt.system, prompt.user, *prompt.earlier))
    m = re.search(rf"(?:\(\d+\) |\"){re.escape(tool)}\b[^\n]*?It takes arguments (\{{.*?\}})\.", text)
    numbers = iter((facts.a, facts.b))
    args = {}
    for arg, schema in (ast.literal_eval(m.group(1)) if m else {}).items():
        if schema.get("type") in ("integer", "number") and not _answer_like(arg):
            args[arg] = next(numbers, 0)
        else:
            args[arg] = _value(schema, arg, facts, {})
    return args


def _react_v2_calls(prompt: Prompt, facts: Facts) -> dict[str, Any]:
    """dspy.ReActV2's ``tool_calls``: one call to a tool, then ``submit`` once a tool result is in."""
    m = re.search(r"The available tools are: (.*)\.", prompt.system)
    tools = re.findall(r"`(\w+)`", m.group(1)) if m else []
    tool = _tool_choice(tools, "submit", any("tool_call_results" in text for text in (prompt.user, *prompt.earlier)))
    return {"tool_calls": [{"name": tool, "args": _tool_args(tool, prompt, facts)}]}


# --------------------------------------------------------------------------- rendering
def _text(value: Any) -> str:
    """A value as ChatAdapter and TwoStepAdapter show it: plain scalars, JSON for structures."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool | int | float):
        return str(value)
    return json.dumps(value)


def _xml(tag: str, value: Any) -> str:
    """A value as XMLAdapter parses it: nested elements for lists (``<item>``) and objects."""
    if isinstance(value, list):
        return f"<{tag}>{''.join(_xml('item', item) for item in value)}</{tag}>"
    if isinstance(value, dict):
        return f"<{tag}>{''.join(_xml(key, item) for key, item in value.items())}</{tag}>"
    return f"<{tag}>{_text(value).replace('&', '&amp;').replace('<', '&lt;')}</{tag}>"


def _render(values: dict[str, Any], prompt: Prompt) -> str:
    """The reply in the format the prompt's adapter asked for."""
    if prompt.two_step_main:
        return "\n".join(f"{name}: {_text(value)}" for name, value in values.items())
    if prompt.json_mode:
        return json.dumps(values)
    if prompt.xml_mode:
        return "\n".join(_xml(name, value) for name, value in values.items())
    return "".join(f"[[ ## {name} ## ]]\n{_text(value)}\n\n" for name, value in values.items()) + "[[ ## completed ## ]]"


# --------------------------------------------------------------------------- the model
def _reflects(outputs: list[str]) -> bool:
    """A reflection prompt asks for an instruction (GEPA's proposer, the sibling merge) or Flex's code."""
    return any("instruction" in name or name == "revised_source" for name in outputs)


def _reflection(prompt: Prompt, outputs: list[str]) -> dict[str, str]:
    """The reflection's reply: the current instruction (or code) echoed, plus ``CAREFUL``."""
    inputs = prompt.inputs()
    instruction = inputs.get("current_instruction") or next(
        (value for key, value in inputs.items() if "instruction" in key), "")
    values = {}
    for name in outputs:
        if name == "revised_source":  # dspy.Flex's code proposer: the same code, commented
            values[name] = inputs.get("current_source", "") + f"\n# {CAREFUL}"
        else:
            values[name] = f"{instruction} {CAREFUL}".strip()
    return values


def answer(prompt: Prompt, fault: Fault | None = None) -> tuple[str, str]:
    """(kind, reply) for one prompt: a pure function of its text."""
    fields = prompt.outputs()
    outputs = [name for name, _ in fields]
    if _TWO_STEP_EXTRACTION in prompt.system:  # TwoStepAdapter's second call: copy the main reply's fields
        kind = "reflection" if _reflects(outputs) else "task"
        return kind, _render(_labelled(prompt.inputs().get("text", ""), outputs), prompt)
    if _reflects(outputs):
        return "reflection", _render(_reflection(prompt, outputs), prompt)
    facts = prompt.facts()
    if facts is not None and fault is not None and faulty(facts.a, facts.b):
        if fault == "error":
            raise InjectedLMError(f"injected LM failure on {facts.a} + {facts.b}")
        return "task", f"Sorry, I lost track of the format; the sum might be {facts.answer}."
    facts = facts or Facts(0, 0, 0)
    values: dict[str, Any] = {}
    for name, type_text in fields:
        schema = _schema_of(type_text, prompt, name)
        if name == "next_tool_name" and "enum" in schema:  # dspy.ReAct
            values[name] = _tool_choice(schema["enum"], "finish", "observation_0" in prompt.user)
        elif name == "next_tool_args":
            values[name] = _tool_args(values.get("next_tool_name", "finish"), prompt, facts)
        elif type_text == "ToolCalls":
            values[name] = _react_v2_calls(prompt, facts)
        else:
            values[name] = _value(schema, name, facts, schema.get("$defs", {}))
    return "task", _render(values, prompt)


def _texts(request: Any) -> list[dict[str, str]]:
    """Role/content dicts of a dspy.lm15 Request, keeping the text parts of messages that also hold images."""
    def joined(parts: Any) -> str:
        if isinstance(parts, str):
            return parts
        return "\n".join(part.text for part in parts if isinstance(part, TextPart))

    messages = [{"role": "system", "content": joined(request.system)}] if request.system is not None else []
    return messages + [{"role": m.role, "content": joined(m.parts)} for m in request.messages]


class _TextEngine(_SimEngine):
    """SimulatedLM's engine, reading text beside images: its own flattening drops a message with an image."""

    def _run(self, request: Any) -> tuple[str, str, list[dict[str, str]]]:
        messages = _texts(request)
        kind, content = self.owner.respond(messages)
        return kind, content, messages


class ZooLM(SimulatedLM):
    """The zoo's task, extraction and reflection model; ``fault`` misbehaves on the ``faulty`` questions."""

    def __init__(self, model: str = "zoo", *, fault: Fault | None = None, **kwargs: Any) -> None:
        self.fault = fault
        super().__init__(model, **kwargs)

    def _bind_engine(self) -> None:
        self._engine_spec = _TextEngine(self)
        self._async_engine_spec = _AsyncSimEngine(self._engine_spec)

    def respond(self, messages: list[dict[str, Any]]) -> tuple[str, str]:
        system = "\n".join(m["content"] for m in messages if m["role"] in ("system", "developer"))
        users = [m["content"] for m in messages if m["role"] == "user"]
        return answer(Prompt(system, users[-1] if users else "", tuple(users[:-1])), self.fault)
