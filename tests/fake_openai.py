"""A local HTTP server that speaks OpenAI chat completions and misbehaves on command.

It stands in for a paid judge API at the HTTP boundary. Queue behaviours with `plan(...)`; when
the queue is empty it answers well. A good answer fills whatever JSON schema the request asked for
(trajectory_i -> score, rubric_i -> verdict); a request without a schema gets plain text.
"""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tests.helpers import serve_in_thread

BEHAVIOURS = {
    "ok",
    "500",
    "timeout",
    "malformed",
    "missing_one",
    "extra_one",
    "out_of_range",
    "slightly_over",
    "fenced",
}


SCORE_MODES = {
    "fixed": "every trajectory gets good_score",
    "random": "uniform in [0, 1]: a judge that guesses",
    "position": "1.0 for the first trajectory in the prompt, falling to 0 for the last: pure position bias",
    "oracle": "the number after 'quality=' in the trajectory's text: a judge that sees the truth",
    "flaky": "oracle, but each judgement is reversed (1 - quality) with probability reverse_rate: known noise",
}


def _trajectory_texts(request: dict[str, Any]) -> list[str]:
    prompt = request["messages"][-1]["content"]
    return re.findall(r'<trajectory id="trajectory_\d+">(.*?)</trajectory>', prompt, flags=re.S)


class FakeOpenAI:
    def __init__(self, *, good_score: float = 0.5, delay_s: float = 0.0, score_mode: str = "fixed") -> None:
        self.queue: deque[str] = deque()
        self.requests: list[dict[str, Any]] = []
        self.good_score = good_score
        assert score_mode in SCORE_MODES, score_mode
        self.score_mode = score_mode
        self.reverse_rate = 0.0  # flaky mode: how often a judgement is reversed
        self._times_seen: dict[str, int] = {}  # random mode: draws keyed by prompt and repeat, not arrival order
        self.verdict: str | None = None  # "Yes"/"No" for every rubric; None: Yes for rubrics 1 and 3
        # A request asking for logprobs gets these first-token probabilities (token -> probability), from the
        # request; None answers without logprobs, as a hosted judge that ignores the parameter does.
        self.first_token_probabilities: Callable[[dict[str, Any]], dict[str, float]] | None = None
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._task_numbers = itertools.count()  # unique across concurrent writer calls (threads answer them)
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        serve_in_thread(self.httpd)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def plan(self, *behaviours: str) -> None:
        assert set(behaviours) <= BEHAVIOURS, behaviours
        self.queue.extend(behaviours)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def _answer(self, request: dict[str, Any], behaviour: str) -> str:
        fmt = request.get("response_format")
        if not fmt:
            return "A plain answer from the policy."
        schema = fmt["json_schema"]["schema"]
        keys = schema["required"]
        if keys == ["tasks"]:  # a task writer: as many tasks as the schema lets it write (6 unbounded)
            count = schema["properties"]["tasks"].get("maxItems", 6)
            return json.dumps(
                {"tasks": [{"task": f"Find email {next(self._task_numbers)}.", "difficulty": 2} for _ in range(count)]}
            )
        if behaviour == "malformed":
            return '{"trajectory_1": {"score": 0.5, "explanation": '
        if behaviour == "missing_one":
            keys = keys[:-1]
        if behaviour == "extra_one":
            keys = [*keys, "trajectory_99" if keys[0].startswith("trajectory") else "rubric_99"]
        scores = self._scores(request, keys)
        score = {"out_of_range": 1.7, "slightly_over": 1.0000004}.get(behaviour)
        body = {
            k: {"explanation": f"judged {k}", "score": score if score is not None else scores[i]}
            if k.startswith("trajectory")
            else {"rationale": f"checked {k}", "verdict": self.verdict or ("Yes" if k.endswith(("1", "3")) else "No")}
            for i, k in enumerate(keys)
        }
        text = json.dumps(body)
        return f"```json\n{text}\n```" if behaviour == "fenced" else text

    def _scores(self, request: dict[str, Any], keys: list[str]) -> list[float]:
        if self.score_mode in ("random", "flaky"):
            prompt = json.dumps(request["messages"], sort_keys=True)
            with self._lock:
                seen = self._times_seen[prompt] = self._times_seen.get(prompt, 0) + 1
            rng = random.Random(f"{prompt}|{seen}")  # the same guesses whatever order concurrent calls arrive in
            if self.score_mode == "random":
                return [rng.random() for _ in keys]
            reversed_ = rng.random() < self.reverse_rate
            found = [re.search(r"quality=(\d+(?:\.\d+)?)", text) for text in _trajectory_texts(request)]
            return [abs(float(reversed_) - (float(m.group(1)) if m else 0.0)) for m in found]
        if self.score_mode == "position":
            return [1 - i / max(len(keys) - 1, 1) for i in range(len(keys))]
        if self.score_mode == "oracle":
            found = [re.search(r"quality=(\d+(?:\.\d+)?)", text) for text in _trajectory_texts(request)]
            return [float(m.group(1)) if m else 0.0 for m in found]
        return [self.good_score] * len(keys)

    def _handler(self):
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                request = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with fake._lock:
                    behaviour = fake.queue.popleft() if fake.queue else "ok"
                    fake.requests.append(request)
                    fake.in_flight += 1
                    fake.max_in_flight = max(fake.max_in_flight, fake.in_flight)
                try:
                    time.sleep(fake.delay_s)
                    if behaviour == "timeout":
                        time.sleep(3.0)
                    if behaviour == "500":
                        self._send(500, {"error": {"message": "injected failure", "type": "server_error"}})
                        return
                    content = fake._answer(request, behaviour)
                    logprobs = None
                    if request.get("logprobs") and fake.first_token_probabilities is not None:
                        probabilities = fake.first_token_probabilities(request)
                        content = max(probabilities, key=probabilities.__getitem__)
                        top = [{"token": t, "logprob": math.log(p), "bytes": None} for t, p in probabilities.items()]
                        logprobs = {"content": [{**top[list(probabilities).index(content)], "top_logprobs": top}]}
                    self._send(
                        200,
                        {
                            "id": "chatcmpl-fake",
                            "object": "chat.completion",
                            "created": int(time.time()),
                            "model": request.get("model", "fake"),
                            "choices": [
                                {
                                    "index": 0,
                                    "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": content},
                                    "logprobs": logprobs,
                                }
                            ],
                            "usage": {"prompt_tokens": 10, "completion_tokens": 10, "total_tokens": 20},
                        },
                    )
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a timeout test)
                finally:
                    with fake._lock:
                        fake.in_flight -= 1

            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        return Handler
