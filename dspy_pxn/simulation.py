"""Synthetic "rule arithmetic" task and a deterministic simulated LM for it.

GEPA benchmarks need an LM whose answers *depend on the instruction* in a way
reflection can improve, yet that is free, fast, offline and reproducible. The
task: apply a made-up named rule (``zorp(x) = 3*x + 1``) to a number. The
simulated task model only knows a rule if its exact canonical definition is in
the instruction; the simulated reflection model learns definitions from the
metric's feedback, one per call, into an instruction of bounded capacity, and
sometimes copies them wrong. So optimisation makes real but noisy progress, and
which rules to keep (the frequent ones) matters.

Everything here is pure logic (no I/O); `latency_server` serves `respond` over
HTTP, and `SimulatedLM` runs it in-process for unit tests.
"""

from __future__ import annotations

import ast
import asyncio
import hashlib
import json
import random
import re
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import dspy

from dspy_pxn.split import Split

__all__ = [
    "CAPACITY",
    "DEFAULT_REFLECTION_ERROR_RATE",
    "RULES",
    "Rule",
    "Split",
    "CallStats",
    "SimulatedLM",
    "make_examples",
    "make_splits",
    "seed_instruction",
    "seed_program",
    "metric",
    "score",
    "respond",
    "chat_completion_body",
    "estimate_tokens",
]

# Max rule definitions an instruction can hold; smaller than the 12 rules so
# the optimiser must choose (and the frequent rules are worth more).
CAPACITY = 5
# Probability that a reflection rewrite copies the harvested definition wrong;
# a module-level default so benchmarks can tune it globally.
DEFAULT_REFLECTION_ERROR_RATE = 0.4

X_RANGE = (1, 50)


# --------------------------------------------------------------------------- #
# Rules
# --------------------------------------------------------------------------- #


def _eval_expr(expr: str, x: int) -> int:
    """Evaluate a tiny integer expression in x without `eval` (prompt text is untrusted)."""

    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.Name) and node.id == "x":
            return x
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = ev(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult)):
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Add):
                return a + b
            if isinstance(node.op, ast.Sub):
                return a - b
            return a * b
        raise ValueError(f"unsupported expression: {expr!r}")

    if len(expr) > 200:
        raise ValueError("expression too long")
    return ev(ast.parse(expr.strip(), mode="eval"))


@dataclass(frozen=True)
class Rule:
    """A named integer function; every expression ends in a constant term so garbling can change it."""

    name: str
    expr: str
    weight: float

    @property
    def definition(self) -> str:
        return f"{self.name}(x) = {self.expr}"

    def apply(self, x: int) -> int:
        return _eval_expr(self.expr, x)


_RULE_SPECS: tuple[tuple[str, str], ...] = (
    ("zorp", "3*x + 1"),
    ("blick", "x*x - 2"),
    ("frim", "2*x + 7"),
    ("quax", "5*x - 3"),
    ("dreb", "x*x + x + 4"),
    ("snell", "7*x + 11"),
    ("plome", "4*x - 9"),
    ("vusk", "2*x*x + 5"),
    ("trag", "9*x + 2"),
    ("mirl", "6*x - 13"),
    ("gorp", "x*x - 3*x + 8"),
    ("wemb", "11*x + 6"),
)

# Zipf weights (1/rank): the top CAPACITY rules cover ~74% of questions, so a
# full instruction of the *right* rules beats one of arbitrary rules.
RULES: tuple[Rule, ...] = tuple(
    Rule(name, expr, 1.0 / (rank + 1)) for rank, (name, expr) in enumerate(_RULE_SPECS)
)
RULES_BY_NAME: dict[str, Rule] = {r.name: r for r in RULES}


def seed_instruction() -> str:
    """The starting instruction: task description only, so the seed program scores ~0."""
    return "Apply the named rule to the number and give the integer result."


def seed_program() -> dspy.Module:
    """The program every benchmark, example and test starts from: CoT with the seed instruction."""
    program = dspy.ChainOfThought("question -> answer")
    program.predict.signature = program.predict.signature.with_instructions(seed_instruction())
    return program


# --------------------------------------------------------------------------- #
# Data
# --------------------------------------------------------------------------- #


def make_examples(n: int, seed: int) -> list[dspy.Example]:
    """`n` questions with rules drawn by Zipf weight and x uniform in 1..50, fixed by `seed`."""
    rng = random.Random(seed)
    weights = [r.weight for r in RULES]
    out = []
    for _ in range(n):
        rule = rng.choices(RULES, weights=weights, k=1)[0]
        x = rng.randint(*X_RANGE)
        out.append(
            dspy.Example(question=f"Apply rule {rule.name} to {x}.", answer=str(rule.apply(x)), rule=rule.name)
            .with_inputs("question")
        )
    return out


def make_splits(seed: int = 0, train: int = 60, val: int = 30, test: int = 100) -> Split:
    """Three splits drawn from distinct derived seeds (so they are independent samples)."""
    base = 1000 * seed
    return Split(
        make_examples(train, base + 1),
        make_examples(val, base + 2),
        make_examples(test, base + 3),
    )


# --------------------------------------------------------------------------- #
# Metric
# --------------------------------------------------------------------------- #

_QUESTION_RE = re.compile(r"rule\s+([A-Za-z_]+)\s+to\s+(-?\d+)", re.IGNORECASE)
_INT_RE = re.compile(r"-?\d+")


def _parse_int(value: Any) -> int | None:
    if value is None:
        return None
    text = str(value).strip()
    try:
        return int(text)
    except ValueError:
        m = _INT_RE.search(text)
        return int(m.group()) if m else None


def metric(gold, pred, trace=None, pred_name=None, pred_trace=None) -> dspy.Prediction:
    """GEPA feedback metric: exact integer match; the feedback on a miss reveals the rule's definition.

    Revealing the definition is what lets reflection learn: it is the only
    place the canonical definitions ever appear.
    """
    expected = _parse_int(gold.get("answer") if hasattr(gold, "get") else getattr(gold, "answer", None))
    got = _parse_int(getattr(pred, "answer", None)) if pred is not None else None
    if expected is not None and got == expected:
        return dspy.Prediction(score=1.0, feedback="Correct.")
    name = gold.get("rule") if hasattr(gold, "get") else None
    if not name:
        m = _QUESTION_RE.search(str(gold.get("question", "")) if hasattr(gold, "get") else "")
        name = m.group(1).lower() if m else None
    rule = RULES_BY_NAME.get(name or "")
    feedback = f"Wrong: expected {expected}."
    if rule is not None:
        feedback += f" Rule definition: {rule.definition}."
    return dspy.Prediction(score=0.0, feedback=feedback)


def score(gold, pred, trace=None) -> float:
    """The metric's score alone, for dspy.Evaluate on held-out data."""
    return metric(gold, pred).score


# --------------------------------------------------------------------------- #
# Prompt parsing helpers
# --------------------------------------------------------------------------- #

# `name(x) = expr` where expr uses only integer-arithmetic characters and ends
# on a digit, `x` or `)` (so a trailing "." or "," is not part of it).
_DEF_RE = re.compile(r"(?<![A-Za-z_])([a-z][a-z_]*)\(x\) = ([0-9x*+\-() ]*[0-9x)])")
_DEF_LINE_RE = re.compile(r"^\s*(?:[-*\u2022]\s*)?([a-z][a-z_]*)\(x\) = ([0-9x*+\-() ]*[0-9x)])\s*[.;]?\s*$")
_FEEDBACK_DEF_RE = re.compile(r"Rule definition: ([a-z][a-z_]*)\(x\) = ([0-9x*+\-() ]*[0-9x)])")
_SECTION_RE = re.compile(r"\[\[ ## (\w+) ## \]\]\n(.*?)(?=\n\[\[ ## \w+ ## \]\]|\Z)", re.DOTALL)
_OUTPUT_FIELDS_RE = re.compile(r"Your output fields are:\n(.*?)(?=All interactions|\Z)", re.DOTALL)
_FIELD_ITEM_RE = re.compile(r"^\d+\. `(\w+)`", re.MULTILINE)
_OBJECTIVE_RE = re.compile(r"your objective is:[ \t]*\n?(.*)\Z", re.DOTALL | re.IGNORECASE)


def _text(content: Any) -> str:
    """Message content as text; OpenAI allows a list of typed parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                parts.append(str(part.get("text", "")))
            else:
                parts.append(str(part))
        return "".join(parts)
    return str(content)


def _split_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
    """(system text, last user text, full prompt text used for hashing)."""
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    user = users[-1] if users else ""
    full = "\n".join(f"{m.get('role')}:{_text(m.get('content'))}" for m in messages)
    return system, user, full


def _sections(text: str) -> dict[str, str]:
    return {name: body.strip() for name, body in _SECTION_RE.findall(text)}


def _output_fields(system: str) -> list[str]:
    m = _OUTPUT_FIELDS_RE.search(system)
    return _FIELD_ITEM_RE.findall(m.group(1)) if m else []


def _instruction_of(system: str) -> str:
    m = _OBJECTIVE_RE.search(system)
    return textwrap.dedent(m.group(1)).strip() if m else ""


def _json_mode(system: str) -> bool:
    """JSONAdapter prompts promise a JSON object; ChatAdapter prompts use field markers."""
    return "JSON object" in system


def _render(fields: Sequence[str], values: Mapping[str, str], json_mode: bool) -> str:
    """Reply in the format the adapter asked for, filling every declared output field."""
    filled = {f: values.get(f, f"(simulated {f})") for f in fields}
    if json_mode:
        return json.dumps(filled, ensure_ascii=False)
    body = "".join(f"[[ ## {f} ## ]]\n{v}\n\n" for f, v in filled.items())
    return body + "[[ ## completed ## ]]"


def _unit(digest: bytes) -> float:
    return int.from_bytes(digest[:8], "big") / 2.0**64


# --------------------------------------------------------------------------- #
# Simulated task model
# --------------------------------------------------------------------------- #


def _wrong(x: int, correct: int | None) -> int:
    """A deterministic guess that is guaranteed wrong."""
    return x if x != correct else x + 1


def _answer_task(system: str, user: str) -> str:
    fields = _output_fields(system) or ["answer"]
    json_mode = _json_mode(system)
    question = _sections(user).get("question", user)
    m = _QUESTION_RE.search(question)
    if not m:
        return _render(fields, {"reasoning": "I could not find a rule application in the question.", "answer": "0"},
                       json_mode)
    name, x = m.group(1).lower(), int(m.group(2))
    rule = RULES_BY_NAME.get(name)
    correct = rule.apply(x) if rule is not None else None
    instruction = _instruction_of(system)
    known = [expr.strip() for n, expr in _DEF_RE.findall(instruction) if n == name]
    if rule is not None and rule.expr in known:
        answer, reasoning = correct, f"By the instruction, {rule.definition}; with x = {x} that is {correct}."
    elif known:
        # A garbled (or foreign) definition: the model faithfully applies it, which is wrong.
        expr = known[-1]
        try:
            answer = _eval_expr(expr, x)
        except (ValueError, SyntaxError, RecursionError):
            answer = _wrong(x, correct)
        if answer == correct:
            answer = _wrong(answer, correct)
        reasoning = f"The instruction says {name}(x) = {expr}; with x = {x} that is {answer}."
    else:
        answer = _wrong(x, correct)
        reasoning = f"The rule {name} is not defined in my instructions, so I return the number unchanged."
    return _render(fields, {"reasoning": reasoning, "answer": str(answer)}, json_mode)


# --------------------------------------------------------------------------- #
# Simulated reflection model
# --------------------------------------------------------------------------- #


def _garble(expr: str, digest: bytes) -> str:
    """Shift the trailing constant by 1..5: always a different function, looks plausible."""
    delta = 1 + digest[8] % 5
    m = re.search(r"(\d+)\s*$", expr)
    if not m:
        return f"{expr} + {delta}"
    return expr[: m.start(1)] + str(int(m.group(1)) + delta)


def _rewrite_instruction(current: str, feedback: str, digest: bytes, error_rate: float) -> str:
    lines = current.splitlines()
    base: list[str] = []
    defs: list[tuple[str, str]] = []
    for line in lines:
        dm = _DEF_LINE_RE.match(line)
        if dm:
            defs.append((dm.group(1), dm.group(2).strip()))
        else:
            base.append(line)
    present = {(n, e.strip()) for n, e in _DEF_RE.findall(current)}
    new: tuple[str, str] | None = None
    for name, expr in _FEEDBACK_DEF_RE.findall(feedback):
        if (name, expr.strip()) not in present:
            new = (name, expr.strip())
            break
    if new is None:
        return current.strip() or seed_instruction()
    if _unit(digest) < error_rate:
        new = (new[0], _garble(new[1], digest))
    # One definition per rule: a corrected one replaces an old (possibly garbled) copy.
    defs = [d for d in defs if d[0] != new[0]] + [new]
    while len(defs) > CAPACITY:
        defs.pop(0)  # oldest first
    head = "\n".join(base).strip() or seed_instruction()
    return head + "\n" + "\n".join(f"{n}(x) = {e}" for n, e in defs)


def _answer_reflection(system: str, user: str, full: str, error_rate: float) -> str:
    sections = _sections(user)
    current = sections.get("current_instruction", "")
    feedback = sections.get("examples_with_feedback", user)
    digest = hashlib.sha256(full.encode("utf-8", "replace")).digest()
    new_instruction = _rewrite_instruction(current, feedback, digest, error_rate)
    fields = _output_fields(system) or ["new_instruction"]
    return _render(fields, {"new_instruction": new_instruction}, _json_mode(system))


def _instruction_literal(source: str) -> ast.Constant | None:
    """The instruction string of the first ``dspy.Signature(spec, instruction)`` in a module source."""
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "Signature"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            return node.args[1]
    return None


def _answer_code(system: str, user: str, full: str, error_rate: float) -> str:
    """dspy.Flex's code proposer: rewrite the instruction inside the module source, as reflection would.

    The simulated code model edits only the instruction literal of the module's
    predictor (learning one definition from the failures' feedback, like reflection),
    and leaves the code around it as it was: enough for GEPA to optimize Flex code.
    """
    sections = _sections(user)
    source = sections.get("current_source", "")
    literal = _instruction_literal(source) if source else None
    fields = _output_fields(system) or ["revised_source"]
    if literal is None:
        return _render(fields, {"revised_source": source}, _json_mode(system))
    digest = hashlib.sha256(full.encode("utf-8", "replace")).digest()
    new_instruction = _rewrite_instruction(literal.value, sections.get("failures", ""), digest, error_rate)
    lines = source.encode().splitlines(keepends=True)  # ast offsets count UTF-8 bytes
    start = sum(len(line) for line in lines[: literal.lineno - 1]) + literal.col_offset
    end = sum(len(line) for line in lines[: literal.end_lineno - 1]) + literal.end_col_offset
    raw = source.encode()
    revised = (raw[:start] + repr(new_instruction).encode() + raw[end:]).decode()
    return _render(fields, {"revised_source": revised}, _json_mode(system))


def _answer_compress(system: str, user: str) -> str:
    """InstructionProposer(max_chars=...) asks to shorten an oversized draft: drop the oldest definitions first."""
    sections = _sections(user)
    instruction = sections.get("instruction", "")
    m = re.search(r"(\d+)", sections.get("length_limit", ""))
    limit = int(m.group(1)) if m else len(instruction)
    lines = instruction.splitlines()
    while len("\n".join(lines)) > limit and any(_DEF_LINE_RE.match(line) for line in lines):
        lines.pop(next(i for i, line in enumerate(lines) if _DEF_LINE_RE.match(line)))
    short = "\n".join(lines).strip()[:limit].strip() or seed_instruction()[:limit]
    fields = _output_fields(system) or ["shortened_instruction"]
    return _render(fields, {"shortened_instruction": short}, _json_mode(system))


def respond(messages: Sequence[Mapping[str, Any]], *, reflection_error_rate: float | None = None) -> tuple[str, str]:
    """Deterministic reply to a DSPy-formatted chat prompt: ``(kind, content)``, kind "task" or "reflection".

    Never raises: a simulated provider that crashes on odd input would make
    benchmark failures about the simulator rather than the optimiser.
    """
    rate = DEFAULT_REFLECTION_ERROR_RATE if reflection_error_rate is None else reflection_error_rate
    try:
        system, user, full = _split_messages(messages)
        if "`new_instruction`" in system:
            return "reflection", _answer_reflection(system, user, full, rate)
        if "`shortened_instruction`" in system:
            return "reflection", _answer_compress(system, user)
        if "`revised_source`" in system:
            return "reflection", _answer_code(system, user, full, rate)
        return "task", _answer_task(system, user)
    except Exception:  # noqa: BLE001 - see docstring
        return "task", "[[ ## reasoning ## ]]\nUnparseable prompt.\n\n[[ ## answer ## ]]\n0\n\n[[ ## completed ## ]]"


def estimate_tokens(text: str) -> int:
    return len(text) // 4


def chat_completion_body(messages: Sequence[Mapping[str, Any]], content: str, model: str) -> dict[str, Any]:
    """An OpenAI chat.completion JSON object; shared by the HTTP server and SimulatedLM.forward."""
    prompt_tokens = sum(estimate_tokens(_text(m.get("content"))) for m in messages)
    completion_tokens = estimate_tokens(content)
    return {
        "id": f"chatcmpl-sim-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop", "logprobs": None}
        ],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


# --------------------------------------------------------------------------- #
# Call accounting
# --------------------------------------------------------------------------- #


class CallStats:
    """Thread-safe call counts and peak concurrency by kind.

    Peak in-flight is the number a parallel optimiser is judged by, so it is
    measured at the point the simulated latency is spent, not inferred.
    """

    KINDS = ("task", "reflection")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {k: 0 for k in self.KINDS}
        self.reset()

    def reset(self) -> None:
        """Zero counters; peaks restart from what is in flight now, so they stay truthful."""
        with self._lock:
            self._calls = {k: 0 for k in self.KINDS}
            self._max = dict(self._in_flight)
            self._max_total = sum(self._in_flight.values())

    @contextmanager
    def track(self, kind: str) -> Iterator[None]:
        with self._lock:
            self._calls[kind] = self._calls.get(kind, 0) + 1
            self._in_flight[kind] = self._in_flight.get(kind, 0) + 1
            self._max[kind] = max(self._max.get(kind, 0), self._in_flight[kind])
            self._max_total = max(self._max_total, sum(self._in_flight.values()))
        try:
            yield
        finally:
            with self._lock:
                self._in_flight[kind] -= 1

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            in_flight = dict(self._in_flight)
            return {
                "calls": {**self._calls, "total": sum(self._calls.values())},
                "in_flight": {**in_flight, "total": sum(in_flight.values())},
                "max_in_flight": {**self._max, "total": self._max_total},
            }


# --------------------------------------------------------------------------- #
# In-process LM
# --------------------------------------------------------------------------- #


def _request_messages(request: Any) -> list[dict[str, str]]:
    """Flatten a dspy.lm15.Request back to role/content dicts, which is what `respond` reads."""
    messages = []
    if request.system is not None:
        system = request.system if isinstance(request.system, str) else "".join(
            getattr(p, "text", "") or "" for p in request.system
        )
        messages.append({"role": "system", "content": system})
    messages.extend({"role": m.role, "content": m.text or ""} for m in request.messages)
    return messages


class _SimEngine:
    """DSPy 3.4 canonical engine (complete(Request) -> Response); avoids the deprecated forward() path."""

    def __init__(self, owner: "SimulatedLM") -> None:
        self.owner = owner

    def _run(self, request: Any) -> tuple[str, str, list[dict[str, str]]]:
        messages = _request_messages(request)
        kind, content = respond(messages, reflection_error_rate=self.owner.reflection_error_rate)
        return kind, content, messages

    def _response(self, content: str, messages: list[dict[str, str]]) -> Any:
        from dspy.lm15 import Message, Response, TextPart, Usage

        prompt_tokens = sum(estimate_tokens(m["content"]) for m in messages)
        completion_tokens = estimate_tokens(content)
        return Response(
            id=f"sim-{uuid.uuid4().hex[:16]}",
            model=self.owner.model,
            message=Message.assistant([TextPart(content)]),
            finish_reason="stop",
            usage=Usage(input_tokens=prompt_tokens, output_tokens=completion_tokens,
                        total_tokens=prompt_tokens + completion_tokens),
        )

    def _overridden_forward(self) -> bool:
        return type(self.owner).forward is not SimulatedLM.forward

    def _via_forward(self, request: Any) -> Any:
        """Honour a subclass's forward() override (e.g. a test spy), as a legacy BaseLM would."""
        from dspy.clients.lm15_boundary import response_value

        return response_value(self.owner.forward(messages=_request_messages(request)), "chat", request)

    def complete(self, request: Any) -> Any:
        if self._overridden_forward():
            return self._via_forward(request)
        kind, content, messages = self._run(request)
        with self.owner.call_stats.track(kind):
            delay = self.owner.latency(kind)
            if delay > 0:
                time.sleep(delay)
        return self._response(content, messages)

    def stream(self, request: Any) -> Any:
        from dspy.lm15 import response_to_events

        return response_to_events(self.complete(request))

    def close(self) -> None:
        pass


class _AsyncSimEngine:
    def __init__(self, sync: _SimEngine) -> None:
        self.sync = sync

    async def complete(self, request: Any) -> Any:
        if self.sync._overridden_forward():
            return await asyncio.to_thread(self.sync._via_forward, request)
        kind, content, messages = self.sync._run(request)
        with self.sync.owner.call_stats.track(kind):
            delay = self.sync.owner.latency(kind)
            if delay > 0:
                await asyncio.sleep(delay)
        return self.sync._response(content, messages)

    async def stream(self, request: Any) -> Any:
        from dspy.lm15 import response_to_events

        for event in response_to_events(await self.complete(request)):
            yield event

    async def aclose(self) -> None:
        pass


class SimulatedLM(dspy.BaseLM):
    """In-process twin of the latency server: same `respond` logic, optional sleeps, call stats.

    Caching is off: a cached reply would hide calls from the stats and skip
    the latency that benchmarks measure. Copies share `call_stats`.
    """

    def __init__(
        self,
        model: str = "sim",
        *,
        task_latency: float = 0.0,
        reflection_latency: float = 0.0,
        reflection_error_rate: float | None = None,
        call_stats: CallStats | None = None,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("temperature", 0.0)
        kwargs.setdefault("max_tokens", 1000)
        super().__init__(model=model, model_type="chat", cache=False, **kwargs)
        self.task_latency = task_latency
        self.reflection_latency = reflection_latency
        self.reflection_error_rate = reflection_error_rate
        self.call_stats = call_stats or CallStats()
        self._bind_engine()

    def _bind_engine(self) -> None:
        # DSPy treats an LM with `_engine_spec` as managed and routes calls to the engine.
        self._engine_spec = _SimEngine(self)
        self._async_engine_spec = _AsyncSimEngine(self._engine_spec)

    def latency(self, kind: str) -> float:
        return self.reflection_latency if kind == "reflection" else self.task_latency

    def stats(self) -> dict[str, Any]:
        return self.call_stats.snapshot()

    def reset_stats(self) -> None:
        self.call_stats.reset()

    def forward(self, prompt: str | None = None, messages: list[dict] | None = None, **kwargs: Any) -> dict[str, Any]:
        """OpenAI-shaped response dict, for callers that use the legacy forward() contract directly."""
        messages = messages or [{"role": "user", "content": prompt or ""}]
        kind, content = respond(messages, reflection_error_rate=self.reflection_error_rate)
        with self.call_stats.track(kind):
            delay = self.latency(kind)
            if delay > 0:
                time.sleep(delay)
        return chat_completion_body(messages, content, self.model)

    def copy(self, **kwargs: Any) -> "SimulatedLM":
        copied = super().copy(**kwargs)
        copied._bind_engine()
        return copied

    def __deepcopy__(self, memo: dict) -> "SimulatedLM":
        # Locks cannot be deep-copied; a copy sharing stats is what callers want anyway.
        return self.copy()
