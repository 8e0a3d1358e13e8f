"""The simulated LM's answers: a deterministic reply to any DSPy-formatted prompt about the rule task.

The task model answers right iff the rule's exact definition is in the instruction. The
reflection model learns one definition per call from the metric's feedback, into an
instruction of bounded capacity (``CAPACITY``), and sometimes copies it wrong. So
optimisation makes real but noisy progress, and which rules to keep matters. A
``Landscape`` changes those numbers (``BREADTH``: several definitions per call, a larger
capacity, and answer noise). It also answers dspy.Flex's code proposer (rewriting the
instruction inside the module source), the instruction proposer's shortening request,
a sibling-merge prompt (``merged_instruction``: combine several improving rewrites), and gepa's own
plain-text reflection prompt (``gepa.optimize``'s default proposer, as MLflow's ``GepaPromptOptimizer``
sends it: no DSPy format, the new instruction expected in a ``` block).
Pure logic, no I/O: the latency server serves it over HTTP, ``SimulatedLM`` in-process.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import textwrap
from collections.abc import Mapping, Sequence
from typing import Any

from dspy_pxn.testing.landscape import DEPTH, Landscape
from dspy_pxn.testing.task import _QUESTION_RE, RULES, RULES_BY_NAME, _eval_expr, parse, seed_instruction
from dspy_pxn.testing.wire import message_text as _text

# Probability that a reflection rewrite copies the harvested definition wrong;
# a module-level default so benchmarks can tune it globally.
DEFAULT_REFLECTION_ERROR_RATE = 0.4


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


def _split_messages(messages: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
    """(system text, last user text, full prompt text used for hashing)."""
    system = "\n".join(_text(m.get("content")) for m in messages if m.get("role") in ("system", "developer"))
    users = [_text(m.get("content")) for m in messages if m.get("role") == "user"]
    user = users[-1] if users else ""
    full = "\n".join(f"{m.get('role')}:{_text(m.get('content'))}" for m in messages)
    return system, user, full


def _sections(text: str) -> dict[str, str]:
    return {name: body.strip() for name, body in _SECTION_RE.findall(text)}


_ADAPTER_TAIL_RE = re.compile(r"\n\s*\nRespond with [^\n]*\s*\Z")


def _without_adapter_tail(section: str) -> str:
    """The last section's own text: DSPy appends its "Respond with ..." line to the user message,
    differently per adapter, and the value must not depend on the adapter."""
    return _ADAPTER_TAIL_RE.sub("", section).strip()


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


def _luck(instruction: str, question: str) -> float:
    """A uniform draw fixed by (instruction, question): the same candidate on the same example is
    always equally lucky, and any edit to the instruction re-draws its luck everywhere."""
    key = f"luck\0{instruction}\0{_without_adapter_tail(question)}".encode("utf-8", "replace")
    return _unit(hashlib.sha256(key).digest())


def _answer_task(system: str, user: str, landscape: Landscape = DEPTH) -> str:
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
    knows = rule is not None and rule.expr in known
    luck = _luck(instruction, question) if landscape.noisy and rule is not None else 1.0
    if knows and luck < landscape.slip_rate:
        answer = _wrong(x, correct)
        reasoning = f"By the instruction, {rule.definition}; with x = {x} that is {answer}."  # a slip
    elif not knows and luck < landscape.guess_rate:
        answer, reasoning = correct, f"The instruction does not settle {name}; my best guess for x = {x} is {correct}."
    elif knows:
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


Definition = tuple[str, str]  # (rule name, expression)


def _split_instruction(text: str) -> tuple[str, list[Definition]]:
    """(head text: every line that is not a definition line, the definition lines in order)."""
    base: list[str] = []
    defs: list[Definition] = []
    for line in text.splitlines():
        dm = _DEF_LINE_RE.match(line)
        if dm:
            defs.append((dm.group(1), dm.group(2).strip()))
        else:
            base.append(line)
    return "\n".join(base).strip(), defs


def _compose(head: str, defs: Sequence[Definition], capacity: int) -> str:
    """Head text then one definition per line, the oldest evicted beyond ``capacity``."""
    defs = list(defs)
    while len(defs) > capacity:
        defs.pop(0)  # oldest first
    return (head or seed_instruction()) + "\n" + "\n".join(f"{n}(x) = {e}" for n, e in defs)


def _learned(current: str, feedback: str, limit: int, chain: bool = False) -> list[Definition]:
    """The first ``limit`` feedback definitions (one per rule) the current instruction lacks verbatim; on a chain,
    only the chain's next rule's: the most frequent one not yet held exactly (none if the feedback lacks it)."""
    present = {(n, e.strip()) for n, e in _DEF_RE.findall(current)}
    wanted = next((rule.name for rule in RULES if (rule.name, rule.expr) not in present), None) if chain else None
    new: list[Definition] = []
    for name, expr in _FEEDBACK_DEF_RE.findall(feedback):
        if chain and name != wanted:
            continue
        if (name, expr.strip()) not in present and all(name != n for n, _ in new):
            new.append((name, expr.strip()))
            if len(new) == limit:
                break
    return new


def _copy_digest(digest: bytes, i: int) -> bytes:
    """The i-th learned definition's own random bytes; the first uses the prompt's digest itself,
    so a one-definition landscape copies exactly as it always has."""
    return digest if i == 0 else hashlib.sha256(digest + i.to_bytes(4, "big")).digest()


def _rewrite_instruction(current: str, feedback: str, digest: bytes, error_rate: float,
                         landscape: Landscape = DEPTH) -> str:
    head, defs = _split_instruction(current)
    new = _learned(current, feedback, landscape.learn_per_call, landscape.chain)
    if not new:
        return current.strip() or seed_instruction()
    copied = []
    for i, (name, expr) in enumerate(new):
        d = _copy_digest(digest, i)
        copied.append((name, _garble(expr, d) if _unit(d) < error_rate else expr))
    # One definition per rule: a corrected one replaces an old (possibly garbled) copy.
    names = {n for n, _ in copied}
    return _compose(head, [d for d in defs if d[0] not in names] + copied, landscape.capacity)


def _answer_reflection(system: str, user: str, full: str, error_rate: float, landscape: Landscape = DEPTH) -> str:
    sections = _sections(user)
    current = sections.get("current_instruction", "")
    feedback = sections.get("examples_with_feedback", user)
    digest = hashlib.sha256(full.encode("utf-8", "replace")).digest()
    new_instruction = _rewrite_instruction(current, feedback, digest, error_rate, landscape)
    fields = _output_fields(system) or ["new_instruction"]
    return _render(fields, {"new_instruction": new_instruction}, _json_mode(system))


# gepa's default reflection prompt (gepa.strategies.instruction_proposal.InstructionProposalSignature), sent as one
# plain user message by gepa.optimize's own proposer (MLflow's GepaPromptOptimizer): the current instruction in the
# first ``` block, the examples with their feedback after it, the reply's new instruction in a ``` block.
_GEPA_REFLECTION_RE = re.compile(
    r"I provided an assistant with the following instructions to perform a task for me:\s*```[^\n]*\n(.*?)\n?```"
    r"(.*?)Your task is to write a new instruction for the assistant\.",
    re.DOTALL,
)


def _answer_gepa_reflection(match: re.Match[str], full: str, error_rate: float, landscape: Landscape = DEPTH) -> str:
    """gepa's plain-text reflection: the same rewrite as a DSPy reflection (one definition learned from the
    feedback, per ``landscape``), returned in a ``` block as gepa's output extractor reads it."""
    current, feedback = match.group(1).strip(), match.group(2)
    digest = hashlib.sha256(full.encode("utf-8", "replace")).digest()
    return "```\n" + _rewrite_instruction(current, feedback, digest, error_rate, landscape) + "\n```"


def _instruction_literal(source: str) -> ast.Constant | None:
    """The instruction string of the first ``dspy.Signature(spec, instruction)`` in a module source."""
    for node in ast.walk(parse(source)):
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


def _answer_code(system: str, user: str, full: str, error_rate: float, landscape: Landscape = DEPTH) -> str:
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
    new_instruction = _rewrite_instruction(literal.value, sections.get("failures", ""), digest, error_rate, landscape)
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


# --------------------------------------------------------------------------- #
# Simulated sibling merge
# --------------------------------------------------------------------------- #

_REWRITE_HEADER_RE = re.compile(r"^#{2,}\s*Rewrite\b.*$", re.MULTILINE | re.IGNORECASE)
_FEEDBACK_MARK_RE = re.compile(r"^\s*Feedback that led to it:?\s*$", re.MULTILINE | re.IGNORECASE)


def _rewrite_texts(improved: str) -> list[str]:
    """Each rewrite's instruction text, without its header and the feedback that led to it.

    The blocks look like ``### Rewrite 1 (minibatch 0/3 -> 2/3)``, the instruction, then
    ``Feedback that led to it:`` and the feedback. A JSON list of strings (a list-typed
    field) is read as one block per item; text without any header as a single block.
    """
    stripped = improved.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except ValueError:
            items = None
        if isinstance(items, list) and all(isinstance(i, str) for i in items):
            return [text for item in items for text in _rewrite_texts(item)]
    headers = list(_REWRITE_HEADER_RE.finditer(improved))
    if headers:
        blocks = [improved[h.end(): nxt.start() if nxt else len(improved)]
                  for h, nxt in zip(headers, [*headers[1:], None])]
    else:
        blocks = [improved]
    return [_added_lines(_FEEDBACK_MARK_RE.split(block, maxsplit=1)[0].strip()) for block in blocks]


def _added_lines(block: str) -> str:
    """A block that lists a rewrite's changes (``- removed`` / ``+ added`` lines) counts by what it added;
    any other block counts whole."""
    lines = block.splitlines()
    if not any(line.startswith("+ ") for line in lines):
        return block
    return "\n".join(line[2:] for line in lines if line.startswith("+ "))


def _vote(versions: Sequence[str]) -> str:
    """The version most rewrites agree on; a tie goes to the one read first."""
    counts = {v: versions.count(v) for v in versions}
    return max(counts, key=lambda v: (counts[v], -versions.index(v)))


def merge_instructions(current: str, rewrites: Sequence[str], capacity: int) -> str:
    """Combine what the rewrites say: the head of ``current``, then one definition per rule.

    Rules in the order read: the current instruction's first, then each rewrite's new ones.
    A rule's version is the one most rewrites that define it agree on (ties to the first
    read); a rule no rewrite defines keeps the current's version. Nothing is learned or
    garbled here: only definitions already written in the instruction texts are used.

    When the rules outnumber the capacity, the merge keeps the current instruction's and
    drops the last-read new ones: the prompt asks to start from the current (best)
    instruction and add the rewrites' improvements, best rewrite first, so a model that
    cannot hold them all leaves out the weakest additions, not the validated base. (A model
    that evicts the oldest, i.e. the base's rules first, was measured too: docs/benchmarks.md.)
    """
    head, current_defs = _split_instruction(current)
    order = [n for n, _ in current_defs]
    versions: dict[str, list[str]] = {}
    for text in rewrites:
        seen: dict[str, str] = {}
        for name, expr in _split_instruction(text)[1]:
            seen[name] = expr  # a rewrite's last word on a rule (there is normally one)
        for name, expr in seen.items():
            versions.setdefault(name, []).append(expr)
            if name not in order:
                order.append(name)
    own = dict(current_defs)
    merged = [(n, _vote(versions[n]) if n in versions else own[n]) for n in dict.fromkeys(order)]
    if not merged:
        return current.strip() or seed_instruction()
    return _compose(head, merged[: max(capacity, len(current_defs))], capacity)


def _answer_merge(system: str, user: str, landscape: Landscape = DEPTH) -> str:
    """A sibling merge: one instruction from the current one and its improving rewrites.

    Modelling assumption: a real reflection LM given a merge prompt combines what it reads
    (every rule definition written in the rewrites, the current instruction's first; when a
    rewrite is shown as its changes, what it added), with no copy errors and nothing new;
    ordinary reflection still learns from feedback, a few definitions per call
    (``Landscape.learn_per_call``). The landscape's capacity holds.
    """
    sections = _sections(user)
    current = sections.get("current_instruction", "")
    improved = _without_adapter_tail(sections.get("improved_instructions", ""))
    merged = merge_instructions(current, _rewrite_texts(improved), landscape.capacity)
    fields = _output_fields(system) or ["merged_instruction"]
    return _render(fields, {"merged_instruction": merged}, _json_mode(system))


# dspy_pxn.proposer.sibling_merge.PLAIN_MERGE_PROMPT: the merge asked in plain text, its reply between ``` marks.
_PLAIN_MERGE_RE = re.compile(r"The current best instruction:\n```\n(?P<current>.*?)\n```\n\nThe improving rewrites:\n\n"
                             r"(?P<improved>.*)\n\nWrite the new instruction within ``` blocks\.", re.DOTALL)


def _answer_plain_merge(match: re.Match[str], landscape: Landscape = DEPTH) -> str:
    """The same merge as ``_answer_merge``, asked in plain text (``dspy_pxn.proposer.sibling_merge.merge_as_plain_text``)."""
    return f"```\n{merge_instructions(match['current'], _rewrite_texts(match['improved']), landscape.capacity)}\n```"


def copy_error_rate(reflection_error_rate: float | None, landscape: Landscape = DEPTH) -> float:
    """The rate in force: the caller's override, else the landscape's, else the module default
    (read at call time, so benchmarks and tests can tune ``DEFAULT_REFLECTION_ERROR_RATE``)."""
    if reflection_error_rate is not None:
        return reflection_error_rate
    return DEFAULT_REFLECTION_ERROR_RATE if landscape.error_rate is None else landscape.error_rate


def respond(messages: Sequence[Mapping[str, Any]], *, reflection_error_rate: float | None = None,
            landscape: Landscape = DEPTH) -> tuple[str, str]:
    """Deterministic reply to a DSPy-formatted chat prompt: ``(kind, content)``, kind "task" or "reflection".

    ``landscape`` is the model's character (``DEPTH``, today's model, unless told);
    ``reflection_error_rate`` overrides its copy-error rate. Never raises: a simulated
    provider that crashes on odd input would make benchmark failures about the simulator
    rather than the optimiser.
    """
    rate = copy_error_rate(reflection_error_rate, landscape)
    try:
        system, user, full = _split_messages(messages)
        if "`merged_instruction`" in system:
            return "reflection", _answer_merge(system, user, landscape)
        if "`new_instruction`" in system:
            return "reflection", _answer_reflection(system, user, full, rate, landscape)
        if "`shortened_instruction`" in system:
            return "reflection", _answer_compress(system, user)
        if "`revised_source`" in system:
            return "reflection", _answer_code(system, user, full, rate, landscape)
        if plain_merge := _PLAIN_MERGE_RE.search(full):
            return "reflection", _answer_plain_merge(plain_merge, landscape)
        if gepa := _GEPA_REFLECTION_RE.search(user):
            return "reflection", _answer_gepa_reflection(gepa, full, rate, landscape)
        return "task", _answer_task(system, user, landscape)
    except Exception:  # noqa: BLE001 - see docstring
        return "task", "[[ ## reasoning ## ]]\nUnparseable prompt.\n\n[[ ## answer ## ]]\n0\n\n[[ ## completed ## ]]"
