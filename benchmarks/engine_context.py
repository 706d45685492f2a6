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
then `--steps` timed steps each way.

With `--server`, also two-turn tool conversations sampled from the real server (a LocalBackend): a call forced
with `tool_choice="required"`, its result sent back parsed, a free answer. Per turn, the sampler/trainer gap
|lp_sampler - lp_trainer| with the turn scored in its engine prompt and in the re-rendered conversation.
Writes benchmarks/results/engine_context.json and its tables in the docs.
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
from agentrl.foundation.base_models import resolve_base_model
from agentrl.foundation.files import write_json_atomic
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
        _, nodes = pack_rows(
            [s.input_ids_T for s in sequences], [0] * len(sequences), 10**9, units=[0] * len(sequences)
        )
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


async def two_turn_mismatch(conversations: int) -> dict[str, Any]:
    """Per-turn sampler/trainer gaps of `conversations` two-turn tool conversations sampled from the server."""
    import asyncio

    from agentrl.backend.sampled_tokens import fill_sampled_tokens
    from agentrl.rl.tokenize import TokenizedSequence, tokenize_history
    from tests.helpers import loss_runs

    add = {"type": "function", "function": {"name": "add", "description": "Add two integers."}}
    add["function"]["parameters"] = {
        "type": "object",
        "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    }
    model = agentrl.TrainableModel(name="engine-context", project="benchmarks", base_path=str(_runs_folder()))
    backend = agentrl.LocalBackend()
    await model.register(backend)
    try:
        client = model.openai_client()

        async def conversation() -> agentrl.Trajectory:
            trajectory = agentrl.Trajectory(
                messages_and_choices=[
                    {"role": "system", "content": "Use the add tool."},
                    {"role": "user", "content": "What is 2 + 3?"},
                ],
                tools=[add],
            )
            first = await client.chat.completions.create(
                model=model.inference_name, messages=trajectory.messages(), tools=[add], tool_choice="required",
                max_tokens=48, temperature=1.0,
            )  # fmt: skip
            trajectory.messages_and_choices.append(first.choices[0])
            calls = first.choices[0].message.tool_calls or []
            trajectory.messages_and_choices += [{"role": "tool", "tool_call_id": c.id, "content": "5"} for c in calls]
            if not calls:
                trajectory.messages_and_choices.append({"role": "user", "content": "Say the sum."})
            second = await client.chat.completions.create(
                model=model.inference_name, messages=trajectory.messages(), tools=[add], max_tokens=24, temperature=1.0
            )
            trajectory.messages_and_choices.append(second.choices[0])
            return trajectory

        sampled = await asyncio.gather(*(conversation() for _ in range(conversations)))
        (group,) = fill_sampled_tokens([agentrl.TrajectoryGroup(sampled)], backend.gateway.store)
        trainer = backend.trainer
        gaps: dict[str, list[list[float]]] = {
            f"{way} turn {t}": [] for way in ("engine", "re-rendered") for t in (1, 2)
        }
        for trajectory in group.trajectories:
            ways = {
                "engine": history_sequences(trajectory, trainer.tokenizer).sequences,
                "re-rendered": [tokenize_history(trajectory, trainer.tokenizer)],
            }
            for way, sequences in ways.items():
                turns = [(s, run) for s in sequences for run in loss_runs(s)]
                for number, (s, (start, end)) in enumerate(turns, 1):
                    mask = [False] * start + [True] * (end - start)
                    alone = TokenizedSequence(s.input_ids_T[:end], mask, s.sampler_logprobs_T[:end], 0.0, 0)
                    (trained,) = trainer.logprobs_of("default", [alone])
                    gaps[f"{way} turn {number}"].append(
                        [abs(a - b) for a, b in zip(s.sampler_logprobs_T[start:end], trained, strict=True)]
                    )
        calls = sum(bool(t.choices()[0].message.tool_calls) for t in group.trajectories)
        summary: dict[str, Any] = {"conversations": conversations, "parsed_calls": calls}
        for key, per_turn in gaps.items():
            flat = [g for turn in per_turn for g in turn]
            summary[key] = {"mismatch_abs_mean": statistics.mean(flat), "mismatch_abs_max": max(flat)}
        return summary
    finally:
        await backend.close()


MODEL_LOGPROBS = "the model's, before the mask (agentrl)"
MASKED_LOGPROBS = "after the mask (vLLM's own; its default strict level)"


def _runs_folder() -> Any:
    import tempfile
    from pathlib import Path

    return Path(tempfile.mkdtemp(prefix="agentrl-engine-context-"))


def mismatch_table(results: dict[str, Any]) -> str:
    lines = [
        "| machine | logprobs under the grammar | conversations (calls parsed) | "
        "turn 1, forced call: engine / re-rendered | turn 2, free answer: engine / re-rendered |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in results.values():

        def cell(turn: int, r: dict[str, Any] = r) -> str:
            engine, rendered = r[f"engine turn {turn}"], r[f"re-rendered turn {turn}"]
            return (
                f"{engine['mismatch_abs_mean']:.3f} (max {engine['mismatch_abs_max']:.2f}) / "
                f"{rendered['mismatch_abs_mean']:.3f} (max {rendered['mismatch_abs_max']:.2f})"
            )

        lines.append(
            f"| {r['machine']}, {r['date']} | {r.get('logprobs', MASKED_LOGPROBS)} | {r['conversations']} "
            f"({r['parsed_calls']}) | {cell(1)} | {cell(2)} |"
        )
    return (
        "Two-turn tool conversations sampled from the server (packaged model, base adapter): the mean and largest "
        "|lp_sampler - lp_trainer| per trained token, each turn scored in its engine prompt and in the re-rendered "
        "conversation. The forced call is sampled under vLLM's grammar; vLLM computes the logprobs it returns after "
        "the grammar's mask, agentrl's servers before it (agentrl_vllm.grammar_logprobs):\n\n" + "\n".join(lines) + "\n"
    )


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
    parser.add_argument("--turns", type=int, nargs="*", default=[1, 2, 4, 8], help="none: only --server")
    parser.add_argument("--steps", type=int, default=2, help="timed steps each way, after one warm-up")
    parser.add_argument("--server", action="store_true", help="also the two-turn gaps from the real server")
    parser.add_argument("--conversations", type=int, default=16, help="with --server: conversations sampled")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    saved: dict[str, Any] = json.loads(ENGINE_RESULTS.read_text()) if ENGINE_RESULTS.exists() else {}
    results, mismatch = saved.get("steps", {}), saved.get("two_turn_mismatch", {})
    if args.server and not args.table_only:
        import asyncio

        measured = asyncio.run(two_turn_mismatch(args.conversations))
        measured.update(machine=machine_label(), date=str(datetime.date.today()), logprobs=MODEL_LOGPROBS)
        mismatch[f"{precision_label()} | {MODEL_LOGPROBS}"] = measured
        write_json_atomic(ENGINE_RESULTS, {"steps": results, "two_turn_mismatch": mismatch})
        print(json.dumps(measured, indent=1), flush=True)
    if args.turns and not args.table_only:
        torch.manual_seed(0)
        trainer = Trainer(resolve_base_model("smollm2-135m-instruct"), seed=0)
        trainer.add_adapter("bench", agentrl.LoRAConfig())
        for turns in args.turns:
            result = measure(trainer, turns, args.steps)
            result.update(machine=machine_label(), date=str(datetime.date.today()))
            results[f"k={turns} | {precision_label()}"] = result
            write_json_atomic(ENGINE_RESULTS, {"steps": results, "two_turn_mismatch": mismatch})
            print(json.dumps(result, indent=1), flush=True)
    text = table(results) + ("\n" + mismatch_table(mismatch) if mismatch else "")
    print(text)
    replace_section(START, END, f"{START}\n{text}{END}")


if __name__ == "__main__":
    main()
