"""Training k-turn tool conversations in the engine's own context: tokens computed and step time, before and after.

    .venv/bin/python -m benchmarks.engine_context [--turns 1 2 4 8]

A group of 8 conversations of k tool-calling turns (the email agent's system prompt and tool schemas, a result
of about 60 tokens after each call), packaged model, one trainer (no server), shared prefix on. Each turn's
engine prompt is rendered as vLLM renders a chat request (the template over the parsed messages, tools as vLLM
dumps them), and each call is sampled as a model writes it, with spacing the template does not reproduce: every
turn after the first starts a new branch, the worst case for the engine-context path. Two ways:
- before: the conversation re-rendered as one sequence (what the trainer did before; later turns are scored in
  a context the engine never rendered);
- after: each turn in its engine prompt (`agentrl.rl.engine_context`), the branches packed into one token tree.
Also per conversation alone: the tree's tokens over its last turn's sequence (the 1.3x target). One warm-up step,
then `--steps` timed steps each way. Writes benchmarks/results/engine_context.json and its table in the docs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
from typing import Any

import torch

import agentrl
from agentrl.backend.training.trainer import Trainer
from agentrl.base_models import resolve_base_model
from agentrl.files import write_json_atomic
from agentrl.rl.engine_context import history_sequences
from agentrl.rl.packing import pack_rows
from agentrl.rl.tokenize import served_tool_order
from agentrl_environments.email_agent.env import SYSTEM_PROMPT, TOOLS
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label, precision_label
from tests.helpers import make_choice

ENGINE_RESULTS = RESULTS.with_name("engine_context.json")
START, END = "<!-- benchmark:engine_context:start -->", "<!-- benchmark:engine_context:end -->"
GROUP_SIZE = 8


def conversation(tokenizer: Any, turns: int, rng: random.Random, *, engine: bool) -> agentrl.Trajectory:
    """One k-turn tool conversation; `engine`: its Choices carry the prompt ids vLLM would have rendered."""
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"When is the meeting with team {rng.randint(1, 99)} about the budget?"},
    ]
    items: list[Any] = list(messages)
    for turn in range(turns):
        words = " ".join(rng.sample(["budget", "meeting", "team", "March", "review", "plan", "draft"], 2))
        text = f'<tool_call>\n{{"name": "search_emails",  "arguments": {{"keywords": "{words}"}}}}\n</tool_call>'
        sampled = tokenizer.encode(text, add_special_tokens=False) + [end]
        rendered = tokenizer.apply_chat_template(
            messages, tools=served_tool_order(TOOLS), tokenize=False, add_generation_prompt=True
        )
        prompt_ids = tokenizer.encode(rendered, add_special_tokens=False)
        call = {"id": f"call_{turn}", "type": "function", "function": {"name": "search_emails"}}
        call["function"]["arguments"] = json.dumps({"keywords": words})
        choice = make_choice(
            sampled,
            [-rng.uniform(0.05, 2.0) for _ in sampled],
            content=None,
            tool_calls=[call],
            prompt_token_ids=prompt_ids if engine else None,
        )
        result = {"role": "tool", "tool_call_id": f"call_{turn}", "content": _result_text(rng)}
        messages += [{"role": "assistant", "content": None, "tool_calls": [call]}, result]
        items += [choice, result]
    return agentrl.Trajectory(messages_and_choices=items, tools=TOOLS, reward=rng.random())


def _result_text(rng: random.Random) -> str:
    rows = [
        {"message_id": f"<{rng.randint(1000, 9999)}@mail>", "subject": "Budget review", "from": "ann@corp.example"}
        for _ in range(2)
    ]
    return json.dumps(rows)


def group(tokenizer: Any, turns: int, seed: int, *, engine: bool) -> list[agentrl.TrajectoryGroup]:
    rng = random.Random(seed)
    return [agentrl.TrajectoryGroup([conversation(tokenizer, turns, rng, engine=engine) for _ in range(GROUP_SIZE)])]


def tree_over_last_turn(tokenizer: Any, turns: int) -> float:
    """The largest, over a group's conversations, of the tokens its own packed tree computes over its last
    turn's sequence (engine prompt + sampled ids)."""
    ratios = []
    for trajectory in group(tokenizer, turns, 0, engine=True)[0].trajectories:
        sequences = history_sequences(trajectory, tokenizer).sequences
        _, nodes = pack_rows([s.input_ids_T for s in sequences], [0] * len(sequences), 10**9, units=[0] * len(sequences))
        ratios.append(nodes[0] / len(sequences[-1]))
    return max(ratios)


def measure(trainer: Trainer, turns: int, steps: int) -> dict[str, Any]:
    config = agentrl.TrainConfig(learning_rate=1e-6, shared_prefix=True)
    rows: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for step in range(steps + 1):  # the first, a warm-up
        for mode in rows:
            groups = group(trainer.tokenizer, turns, step, engine=mode == "after")
            metrics = trainer.train_step("bench", groups, config).metrics
            print(
                f"k={turns} {mode}: {metrics['train_s']:.1f} s, {metrics['forward_tokens']:.0f} tokens computed, "
                f"{metrics['context_exact_turns']:.0f}/{metrics['sampled_turns']:.0f} turns context-exact",
                flush=True,
            )
            if step:
                rows[mode].append(metrics)
    summary: dict[str, Any] = {"turns": turns, "tree_over_last_turn_max": tree_over_last_turn(trainer.tokenizer, turns)}
    for mode, metrics in rows.items():
        summary[mode] = {
            "forward_tokens": statistics.mean(m["forward_tokens"] for m in metrics),
            "sequences": statistics.mean(m["num_sequences"] for m in metrics),
            "context_exact_turns": statistics.mean(m["context_exact_turns"] for m in metrics),
            "sampled_turns": statistics.mean(m["sampled_turns"] for m in metrics),
            "train_s": statistics.median(m["train_s"] for m in metrics),
        }
    return summary


def table(results: dict[str, Any]) -> str:
    lines = [
        "| turns k | machine | context-exact turns, before -> after | tokens computed, before -> after | "
        "train time, before -> after | tree / last turn's sequence (max) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(results.values(), key=lambda r: (r["machine"], r["turns"])):
        before, after = r["before"], r["after"]
        lines.append(
            f"| {r['turns']} | {r['machine']}, {r['date']} | {before['context_exact_turns']:.0f} of "
            f"{before['sampled_turns']:.0f} -> {after['context_exact_turns']:.0f} of {after['sampled_turns']:.0f} | "
            f"{before['forward_tokens']:.0f} -> {after['forward_tokens']:.0f} "
            f"({after['forward_tokens'] / before['forward_tokens']:.2f}x) | {before['train_s']:.1f} s -> "
            f"{after['train_s']:.1f} s | {r['tree_over_last_turn_max']:.2f}x |"
        )
    return (
        f"One GRPO step on a group of {GROUP_SIZE} k-turn tool conversations (every call re-rendered differently, so "
        "every later turn branches), packaged model, one trainer, shared prefix on; median of the timed steps:\n\n"
        + "\n".join(lines)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--steps", type=int, default=2, help="timed steps each way, after one warm-up")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(ENGINE_RESULTS.read_text()) if ENGINE_RESULTS.exists() else {}
    if not args.table_only:
        torch.manual_seed(0)
        trainer = Trainer(resolve_base_model("smollm2-135m-instruct"), seed=0)
        trainer.add_adapter("bench", agentrl.LoRAConfig())
        for turns in args.turns:
            result = measure(trainer, turns, args.steps)
            result.update(machine=machine_label(), date=str(datetime.date.today()))
            results[f"k={turns} | {precision_label()}"] = result
            write_json_atomic(ENGINE_RESULTS, results)
            print(json.dumps(result, indent=1), flush=True)
    text = table(results)
    print(text)
    replace_section(START, END, f"{START}\n{text}{END}")


if __name__ == "__main__":
    main()
