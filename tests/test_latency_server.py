"""End-to-end tests of the latency server through the real dspy.LM -> litellm -> openai SDK -> HTTP path."""

from __future__ import annotations

import http.client
import json
import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import NormalDist

import dspy
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # no conftest/pyproject owns sys.path yet
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network: skip litellm's cost-map download

from dspy_pxn import testing as sim  # noqa: E402
from dspy_pxn.testing import LatencyServer  # noqa: E402
from dspy_pxn.testing.latency import (  # noqa: E402
    LOGNORMAL_SIGMA,
    STRAGGLER_FACTOR,
    STRAGGLER_RATE,
    LatencySampler,
    draw_latency,
    quantile,
)
from tests.processes import alive, wait_gone  # noqa: E402

ZORP = sim.RULES_BY_NAME["zorp"]


@pytest.fixture(scope="module")
def server():
    with LatencyServer() as srv:
        yield srv


def post(srv: LatencyServer, path: str, payload: dict | bytes) -> tuple[int, dict | str, dict]:
    conn = http.client.HTTPConnection("127.0.0.1", int(srv.base_url.split(":")[2].split("/")[0]), timeout=10)
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read().decode()
    headers = dict(resp.getheaders())
    conn.close()
    try:
        return resp.status, json.loads(raw), headers
    except ValueError:
        return resp.status, raw, headers


def cot_with(instruction: str) -> dspy.Module:
    cot = dspy.ChainOfThought("question -> answer")
    cot.predict.signature = cot.predict.signature.with_instructions(instruction)
    return cot


# --------------------------------------------------------------------------- #
# HTTP surface
# --------------------------------------------------------------------------- #


def test_ready_line_and_endpoints(server):
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", server.base_url)
    with urllib.request.urlopen(server.root_url + "/health", timeout=5) as r:
        assert json.loads(r.read()) == {"status": "ok"}
    with urllib.request.urlopen(server.base_url + "/models", timeout=5) as r:
        assert {m["id"] for m in json.loads(r.read())["data"]} >= {"sim-task"}
    stats = server.stats()
    assert set(stats) >= {"calls", "in_flight", "max_in_flight"}
    assert set(stats["max_in_flight"]) == {"task", "reflection", "total"}
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(server.root_url + "/nope", timeout=5)
    assert err.value.code == 404


def test_chat_completion_shape_and_keep_alive(server):
    messages = [{"role": "user", "content": "[[ ## question ## ]]\nApply rule zorp to 3."}]
    port = int(server.base_url.rsplit(":", 1)[1].split("/")[0])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    bodies = []
    for _ in range(3):  # three requests over one persistent connection
        conn.request("POST", "/v1/chat/completions", body=json.dumps({"model": "sim-task", "messages": messages}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        raw = resp.read()
        assert resp.status == 200 and int(resp.getheader("Content-Length")) == len(raw)
        assert not resp.will_close
        bodies.append(json.loads(raw))
    conn.close()
    body = bodies[0]
    assert body["object"] == "chat.completion" and body["model"] == "sim-task" and body["id"]
    assert isinstance(body["created"], int)
    choice = body["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["message"]["role"] == "assistant"
    assert "[[ ## answer ## ]]\n3" in choice["message"]["content"]  # unknown rule definition: guesses x
    usage = body["usage"]
    assert usage["completion_tokens"] == len(choice["message"]["content"]) // 4
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert len({b["choices"][0]["message"]["content"] for b in bodies}) == 1


def test_bad_request_is_400(server):
    status, body, _ = post(server, "/v1/chat/completions", b"{not json")
    assert status == 400 and "error" in body
    status, body, _ = post(server, "/v1/chat/completions", {"model": "x"})
    assert status == 400


def test_streaming_sse(server):
    messages = [{"role": "user", "content": "[[ ## question ## ]]\nApply rule zorp to 3."}]
    status, raw, headers = post(server, "/v1/chat/completions",
                                {"model": "sim-task", "messages": messages, "stream": True,
                                 "stream_options": {"include_usage": True}})
    assert status == 200 and headers["Content-Type"] == "text/event-stream"
    events = [line[6:] for line in raw.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]).startswith("[[ ##")
    assert chunks[-1]["usage"]["total_tokens"] > 0

    import litellm  # the SSE rendering must be readable by litellm's own stream parser

    stream = litellm.completion(model="openai/sim-task", api_base=server.base_url, api_key="sim",
                                messages=messages, stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream)
    assert "[[ ## answer ## ]]\n3" in text


# --------------------------------------------------------------------------- #
# Through dspy.LM + litellm
# --------------------------------------------------------------------------- #


def test_chain_of_thought_over_http_flips_with_definition(server, engine):
    server.reset_stats()
    lm = server.lm(**engine)
    assert lm.model == "openai/sim-task" and lm.engine == engine.get("engine", "auto")
    with dspy.context(lm=lm):
        assert cot_with(sim.seed_instruction())(question="Apply rule zorp to 17.").answer == "17"
        assert cot_with(sim.seed_instruction() + "\n" + ZORP.definition)(question="Apply rule zorp to 17.").answer == "52"
    stats = server.stats()
    assert stats["calls"]["task"] == 2 and stats["calls"]["reflection"] == 0
    # The engine asked for made the calls: DSPy's own lm15 client by default, the openai SDK under litellm.
    expected = "openai-python/" if engine else "lm15/"
    assert set(stats["clients"]) and all(client.startswith(expected) for client in stats["clients"])


def test_reflection_via_instruction_proposer(server):
    from dspy.teleprompt.gepa.instruction_proposal import InstructionProposer

    server.reset_stats()
    reflection_lm = server.lm("reflection")
    dataset = [{"Inputs": {"question": "Apply rule zorp to 17."},
                "Generated Outputs": {"reasoning": "unknown rule", "answer": "17"},
                "Feedback": "Wrong: expected 52. Rule definition: zorp(x) = 3*x + 1."}]
    with dspy.context(lm=reflection_lm):
        out = InstructionProposer()({"predict": sim.seed_instruction()}, {"predict": dataset}, ["predict"])
    new = out["predict"]
    assert new.startswith(sim.seed_instruction())
    assert re.search(r"^zorp\(x\) = 3\*x \+ \d+$", new, re.MULTILINE)  # harvested (possibly garbled)
    # The server ran exactly the local logic on the prompt it received.
    (sent,) = [h["messages"] for h in reflection_lm.history]
    kind, content = sim.respond(sent)
    assert kind == "reflection" and json.loads(content)["new_instruction"] == new
    assert server.stats()["calls"] == {"task": 0, "reflection": 1, "total": 1}


def test_concurrent_calls_overlap():
    latency, n = 0.3, 16
    with LatencyServer(task_latency=latency) as srv:
        lm = srv.lm()
        cot = cot_with(sim.seed_instruction())

        def call(i: int) -> str:
            with dspy.context(lm=lm):
                return cot(question=f"Apply rule zorp to {i}.").answer

        call(0)  # warm-up: litellm import and client construction are not part of the measurement
        srv.reset_stats()
        start = time.perf_counter()
        with ThreadPoolExecutor(n) as pool:
            answers = list(pool.map(call, range(1, n + 1)))
        elapsed = time.perf_counter() - start
        stats, timeline = srv.stats(), srv.timeline()
    assert answers == [str(i) for i in range(1, n + 1)]
    assert stats["calls"]["task"] == n and stats["in_flight"]["total"] == 0
    assert elapsed < n * latency / 3, elapsed
    assert stats["max_in_flight"]["task"] >= 8, stats
    assert stats["max_in_flight"]["total"] >= stats["max_in_flight"]["task"]
    # The timeline places each call's latency in time (epoch seconds, by start), since the reset only: the
    # overlap the counters saw, seen from when the calls slept.
    assert [kind for kind, _, _ in timeline] == ["task"] * n
    assert [start for _, start, _ in timeline] == sorted(start for _, start, _ in timeline)
    assert all(latency <= end - start < latency + 1.0 for _, start, end in timeline), timeline
    edges = sorted([(start, 1) for _, start, _ in timeline] + [(end, -1) for _, _, end in timeline])
    asleep = [sum(step for _, step in edges[: i + 1]) for i in range(len(edges))]
    assert 8 <= max(asleep) <= stats["max_in_flight"]["task"], (asleep, stats)


def test_a_pickled_call_log_keeps_its_counts_and_starts_its_own_timeline():
    """A program logged as an MLflow model is pickled with its simulated LM: the copy counts on from the calls so
    far, but does not carry the timeline of the run that logged it."""
    import pickle

    stats = sim.CallStats()
    for kind in ("task", "task", "reflection"):
        with stats.track(kind):
            pass
    copy = pickle.loads(pickle.dumps(stats))
    assert copy.snapshot()["calls"] == stats.snapshot()["calls"] == {"task": 2, "reflection": 1, "total": 3}
    assert [kind for kind, _, _ in stats.timeline()] == ["task", "task", "reflection"] and copy.timeline() == []
    with copy.track("task"):
        pass
    assert [kind for kind, _, _ in copy.timeline()] == ["task"] and len(stats.timeline()) == 3


def test_gepa_smoke_makes_progress(server):
    logging.getLogger("dspy").setLevel(logging.ERROR)
    server.reset_stats()
    train, val = sim.make_examples(20, seed=11), sim.make_examples(10, seed=12)
    student = cot_with(sim.seed_instruction())
    gepa = dspy.GEPA(metric=sim.metric, max_metric_calls=80, reflection_lm=server.lm("reflection"), num_threads=8,
                     use_merge=False, reflection_minibatch_size=3, track_stats=True)
    with dspy.context(lm=server.lm()):
        optimized = gepa.compile(student, trainset=train, valset=val)
    results = optimized.detailed_results
    seed_score, best_score = results.val_aggregate_scores[0], results.val_aggregate_scores[results.best_idx]
    assert best_score > seed_score, results.val_aggregate_scores
    assert "(x) = " in optimized.predict.signature.instructions
    stats = server.stats()
    assert stats["calls"]["reflection"] >= 1 and stats["calls"]["task"] >= 10


# --------------------------------------------------------------------------- #
# Lifecycle
# --------------------------------------------------------------------------- #


def test_startup_failure_reports_stderr():
    with pytest.raises(RuntimeError, match=r"(?s)exited.*stderr.*Error"):
        LatencyServer(port=-5, startup_timeout=20).start()


def test_close_terminates_process():
    srv = LatencyServer().start()
    url = srv.root_url
    proc = srv._proc
    srv.close()
    assert proc is not None and proc.poll() is not None
    with pytest.raises(OSError):
        urllib.request.urlopen(url + "/health", timeout=2)
    srv.close()  # idempotent


@pytest.mark.slow
def test_a_server_whose_parent_was_killed_stops(tmp_path: Path) -> None:
    """A benchmark or example killed outright never closes its server: the server stops by itself."""
    script = tmp_path / "parent.py"
    script.write_text("import time\nfrom dspy_pxn.testing import LatencyServer\n"
                      "server = LatencyServer().start()\nprint(server._proc.pid, flush=True)\ntime.sleep(600)\n")
    parent = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.0)  # longer than the server's check: it keeps serving while its parent lives
        assert alive(child)
    finally:
        parent.kill()
        parent.wait()
    stopped = wait_gone(child)
    if not stopped:
        os.kill(child, signal.SIGKILL)  # not left behind by a failing run
    assert stopped


# --------------------------------------------------------------------------- #
# Latency distributions
# --------------------------------------------------------------------------- #
DRAWS = 200_000


def draws(distribution: str, median: float = 1.0, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    return sorted(draw_latency(median, distribution, rng) for _ in range(DRAWS))


def heavy_quantile(q: float) -> float:
    """The heavy mixture's q-quantile (in medians), by bisection on its survival function."""
    lo_f, hi_f = STRAGGLER_FACTOR

    def survival(t: float) -> float:
        body = 1 - NormalDist(0, LOGNORMAL_SIGMA).cdf(math.log(t))
        straggler = min(1.0, max(0.0, (hi_f - t) / (hi_f - lo_f)))
        return (1 - STRAGGLER_RATE) * body + STRAGGLER_RATE * straggler

    lo, hi = 1e-3, hi_f
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if survival(mid) > 1 - q else (lo, mid)
    return (lo + hi) / 2


def test_fixed_latency_is_exact():
    rng = random.Random(0)
    assert {draw_latency(0.7, "fixed", rng) for _ in range(100)} == {0.7}
    assert draw_latency(0.0, "lognormal", rng) == 0.0 and draw_latency(0.0, "heavy", rng) == 0.0


def test_lognormal_has_the_configured_median_and_p99_over_p50_of_4():
    xs = draws("lognormal", median=0.5)
    p50, p90, p99 = (quantile(xs, q) for q in (0.5, 0.9, 0.99))
    assert abs(p50 / 0.5 - 1) < 0.02
    assert abs(p99 / p50 - 4) < 0.2, p99 / p50
    # σ = ln 4 / 2.326 puts p90 at exp(1.2816 σ) ≈ 2.15 medians.
    assert abs(p90 / p50 - math.exp(NormalDist().inv_cdf(0.9) * LOGNORMAL_SIGMA)) < 0.05
    assert xs[0] > 0


def test_heavy_tail_has_stragglers_beyond_the_lognormal():
    xs = draws("heavy")
    for q in (0.5, 0.9, 0.99):
        expected = heavy_quantile(q)
        assert abs(quantile(xs, q) / expected - 1) < 0.04, (q, quantile(xs, q), expected)
    assert quantile(xs, 0.99) > 3 * quantile(draws("lognormal"), 0.99)  # p99 ≈ 15 medians, not 4
    assert xs[-1] <= STRAGGLER_FACTOR[1]
    beyond = sum(x > STRAGGLER_FACTOR[0] for x in xs) / DRAWS  # stragglers plus the body's own rare tail
    assert STRAGGLER_RATE < beyond < STRAGGLER_RATE + 0.006, beyond


def test_sampler_is_seeded_per_kind_and_records_what_it_hands_out():
    def sequence(seed: int, interleave: bool) -> list[float]:
        sampler = LatencySampler("lognormal", seed)
        out = []
        for _ in range(50):
            out.append(sampler.draw("task", 1.0))
            if interleave:
                sampler.draw("reflection", 4.0)
        return out

    assert sequence(3, False) == sequence(3, True)  # reflection calls do not shift the task sequence
    assert sequence(3, False) != sequence(4, False)
    sampler = LatencySampler("heavy", seed=1)
    handed = [sampler.draw("task", 0.1) for _ in range(101)]
    summary = sampler.summary()
    assert summary["distribution"] == "heavy" and summary["seed"] == 1
    task = summary["task"]
    assert task["count"] == 101 and task["max"] == max(handed)
    assert task["p50"] == sorted(handed)[50] and abs(task["mean"] - sum(handed) / 101) < 1e-12
    assert summary["reflection"]["count"] == 0
    sampler.reset()
    assert sampler.summary()["task"]["count"] == 0 and sampler.draw("task", 0.1) != handed[0]
    with pytest.raises(ValueError, match="lognormal"):
        LatencySampler("gaussian")


def test_simulated_lm_draws_latencies_and_reports_them():
    lm = sim.SimulatedLM(task_latency=0.002, latency="lognormal", seed=5)
    twin = sim.SimulatedLM(task_latency=0.002, latency="lognormal", seed=5)
    for model in (lm, twin):
        with dspy.context(lm=model):
            for i in range(20):
                cot_with(sim.seed_instruction())(question=f"Apply rule zorp to {i}.")
    assert lm.stats()["latency"] == twin.stats()["latency"]  # same seed, same sequence
    task = lm.stats()["latency"]["task"]
    assert task["count"] == 20 and task["p50"] != task["max"] and 0.0005 < task["p50"] < 0.008


def chat(srv: LatencyServer, question: str) -> None:
    status, body, _ = post(srv, "/v1/chat/completions",
                           {"model": "sim-task", "messages": [{"role": "user", "content": f"[[ ## question ## ]]\n{question}"}]})
    assert status == 200, body


def test_server_sleeps_drawn_latencies_and_reports_them():
    median, n = 0.02, 30
    runs = []
    for _ in range(2):
        with LatencyServer(task_latency=median, reflection_latency=0.05, latency="lognormal", seed=7) as srv:
            start = time.perf_counter()
            for i in range(n):
                chat(srv, f"Apply rule zorp to {i}.")
            elapsed = time.perf_counter() - start
            runs.append((srv.stats(), elapsed))
    stats, elapsed = runs[0]
    latency = stats["latency"]
    assert latency["distribution"] == "lognormal" and latency["seed"] == 7
    assert stats["config"]["latency"] == "lognormal" and stats["config"]["latency_seed"] == 7
    task = latency["task"]
    assert task["count"] == n and latency["reflection"]["count"] == 0
    assert task["p50"] < task["p99"] <= task["max"] and 0.5 * median < task["p50"] < 2 * median
    assert elapsed >= n * task["mean"]  # one call at a time: the wall-clock covers every latency it slept
    assert runs[1][0]["latency"] == latency  # same seed, sequential calls: the same draws


def test_fixed_server_reports_its_fixed_latency(server):
    server.reset_stats()
    chat(server, "Apply rule zorp to 1.")
    latency = server.stats()["latency"]
    assert latency["distribution"] == "fixed"
    assert latency["task"] == {"count": 1, "mean": 0.0, "p50": 0.0, "p99": 0.0, "max": 0.0}


# --------------------------------------------------------------------------- #
# Landscapes and the merge prompt over HTTP
# --------------------------------------------------------------------------- #


def test_server_answers_with_its_landscape():
    from dataclasses import asdict

    custom = sim.Landscape(name="mine", learn_per_call=2, capacity=6, slip_rate=0.3, guess_rate=0.0)
    for landscape in (sim.BREADTH, custom):
        with LatencyServer(landscape=landscape) as srv:
            assert srv.stats()["config"]["landscape"] == asdict(landscape)
            lm = srv.lm()
            instruction = sim.seed_instruction() + "\n" + ZORP.definition
            with dspy.context(lm=lm):
                for i in range(1, 31):
                    cot_with(instruction)(question=f"Apply rule zorp to {i}.")
            # Every reply is the in-process model's on this landscape, noise included ...
            slipped = 0
            for entry in lm.history:
                sent, got = entry["messages"], entry["outputs"][0]
                assert got == sim.respond(sent, landscape=landscape)[1]
                slipped += got != sim.respond(sent)[1]  # ... which DEPTH's noiseless answer is not, sometimes
            assert len(lm.history) == 30 and 0 < slipped < 20, slipped


def test_merge_prompt_over_http(server):
    class Merge(dspy.Signature):
        """Combine the improving rewrites into one instruction."""

        current_instruction: str = dspy.InputField()
        improved_instructions: str = dspy.InputField()
        merged_instruction: str = dspy.OutputField()

    blick = sim.RULES_BY_NAME["blick"]
    improved = (f"### Rewrite 1 (minibatch 0/3 -> 2/3)\nGo.\n{ZORP.definition}\nFeedback that led to it:\nWrong.\n\n"
                f"### Rewrite 2 (minibatch 1/3 -> 3/3)\nGo.\n{blick.definition}\nFeedback that led to it:\nWrong.")
    server.reset_stats()
    with dspy.context(lm=server.lm("reflection")):
        out = dspy.Predict(Merge)(current_instruction="Go.", improved_instructions=improved)
    assert out.merged_instruction == f"Go.\n{ZORP.definition}\n{blick.definition}"
    assert server.stats()["calls"]["reflection"] == 1
