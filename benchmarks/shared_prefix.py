"""Shared-prefix training against the unshared computation: tokens computed, step time, same result.

    .venv/bin/python -m benchmarks.shared_prefix [--steps 3]

Two step shapes, packaged model, one trainer (no server):
- the main job's: 8 groups x 8 answers to larger_number prompts (the chat template's system
  prompt and the question shared, answers of up to 16 tokens, as the main job samples them);
- a long-prompt tool task: 4 groups x 8 email-agent rollouts (system prompt, three tool schemas,
  the question; search, read and answer turns with the tool results), where half a group's
  rollouts share their first two tool calls and the other half search differently.
For each, the same sequences' gradients from the same weights both ways (the loss's relative
difference and the gradients' relative gap), then timed GRPO steps each way, alternating (`--steps`
for the main job's shape after one warm-up step each; `--email-steps` for the email shape, whose
unshared step is long). Writes benchmarks/results/shared_prefix.json and its table in the docs.
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
from agentrl.rl.advantages import compute_group_advantages
from agentrl.rl.engine_context import tokenize_groups
from agentrl.rl.tokenize import demonstrated_tokens
from agentrl_environments.larger_number.task import scenarios
from benchmarks.readme import replace_section
from benchmarks.step_breakdown import RESULTS, machine_label, precision_label
from tests.helpers import make_choice

SHARED_RESULTS = RESULTS.with_name("shared_prefix.json")
START, END = "<!-- benchmark:shared_prefix:start -->", "<!-- benchmark:shared_prefix:end -->"


def main_job_groups(tokenizer: Any, seed: int) -> list[agentrl.TrajectoryGroup]:
    """8 larger_number prompts x 8 sampled-looking answers of up to 16 tokens, rewards 0/1."""
    rng = random.Random(seed)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    groups = []
    for scenario in scenarios("train", 8, seed=seed):
        trajectories = []
        for _ in range(8):
            number = rng.choice([scenario.a, scenario.b, rng.randint(10, 99)])
            text = rng.choice([f"{number}", f"The larger number is {number}.", f"{number} is larger than the other."])
            ids = tokenizer.encode(text, add_special_tokens=False)[:15] + [end]
            trajectories.append(
                agentrl.Trajectory(
                    messages_and_choices=[
                        {"role": "user", "content": scenario.prompt},
                        make_choice(ids, [-rng.uniform(0.1, 3.0) for _ in ids], content=text),
                    ],
                    reward=float(number == scenario.answer),
                )
            )
        groups.append(agentrl.TrajectoryGroup(trajectories))
    return groups


def email_groups(tokenizer: Any, seed: int) -> list[agentrl.TrajectoryGroup]:
    """4 email questions x 8 rollouts made from the demonstrations: written tool calls become sampled turns."""
    from agentrl_environments.email_agent.env import EmailEnvironment, demonstration

    rng = random.Random(seed)
    env = EmailEnvironment.load()
    groups = []
    for question in rng.sample(env.data.split("train"), 4):
        base = demonstration(question, env)
        trajectories = []
        for member in range(8):
            messages = [dict(m) for m in base.messages_and_choices if isinstance(m, dict)]
            if member >= 4:  # the other half searches with other words: they share only the prompt
                call = messages[2]["tool_calls"][0]
                words = json.loads(call["function"]["arguments"])["keywords"].split()
                rng.shuffle(words)
                messages[2] = {
                    **messages[2],
                    "tool_calls": [
                        {
                            **call,
                            "function": {
                                **call["function"],
                                "arguments": json.dumps({"keywords": " ".join(words[:2])}),
                            },
                        }
                    ],
                }
            answer = messages[6]["tool_calls"][0]
            arguments = json.loads(answer["function"]["arguments"])
            arguments["answer"] = f"{arguments['answer']} {rng.choice(['', 'I think.', '(from the email)'])}".strip()
            messages[6] = {
                **messages[6],
                "tool_calls": [{**answer, "function": {**answer["function"], "arguments": json.dumps(arguments)}}],
            }
            sampled: list[Any] = []
            for index, message in enumerate(messages):
                if message["role"] != "assistant":
                    sampled.append(message)
                    continue
                ids = demonstrated_tokens(messages, index, base.tools, tokenizer).token_ids
                sampled.append(
                    make_choice(
                        ids, [-rng.uniform(0.1, 2.0) for _ in ids], content="", tool_calls=message["tool_calls"]
                    )
                )
            trajectories.append(agentrl.Trajectory(messages_and_choices=sampled, tools=base.tools, reward=rng.random()))
        groups.append(agentrl.TrajectoryGroup(trajectories))
    return groups


def agreement(trainer: Trainer, groups: list[agentrl.TrajectoryGroup], config: agentrl.TrainConfig) -> dict[str, float]:
    """The loss and gradients both ways from the same weights: relative difference and gap."""
    advantages = compute_group_advantages([g.rewards for g in groups], scale_by_std=True)
    kept = [groups[i] for i in advantages.kept_group_indices]
    sequences = tokenize_groups(kept, advantages.advantages_P_G, trainer.tokenizer).sequences
    adapter = trainer._activate("bench")
    results = []
    for shared in (False, True):
        adapter.optimizer.zero_grad(set_to_none=True)
        sums, _ = trainer._accumulate_gradients(
            sequences, config.model_copy(update={"shared_prefix": shared}), 100.0, trainer.micro_batch_tokens
        )
        results.append((float(sums["loss"]), torch.cat([p.grad.flatten() for p in adapter.parameters])))
    adapter.optimizer.zero_grad(set_to_none=True)
    (plain_loss, plain_grad), (packed_loss, packed_grad) = results
    return {
        "loss_relative_difference": abs(packed_loss - plain_loss) / abs(plain_loss),
        "gradient_relative_gap": float(torch.linalg.norm(packed_grad - plain_grad) / torch.linalg.norm(plain_grad)),
    }


def measure(trainer: Trainer, make_groups: Any, steps: int, *, warm_up: bool) -> dict[str, Any]:
    config = agentrl.TrainConfig(learning_rate=1e-6, kl_coef=0.0)
    check = agreement(trainer, make_groups(trainer.tokenizer, 100), config.model_copy(update={"kl_coef": 0.1}))
    rows: dict[str, list[dict[str, float]]] = {"unshared": [], "shared": []}
    for step in range(steps + warm_up):
        for mode in rows:
            groups = make_groups(trainer.tokenizer, step)
            metrics = trainer.train_step(
                "bench", groups, config.model_copy(update={"shared_prefix": mode == "shared"})
            ).metrics
            print(f"{mode}: {metrics['train_s']:.1f} s, {metrics['forward_tokens']:.0f} tokens computed", flush=True)
            if step or not warm_up:
                rows[mode].append(metrics)
    summary: dict[str, Any] = {"agreement": check}
    for mode, metrics in rows.items():
        summary[mode] = {
            "tokens": statistics.mean(m["total_tokens"] for m in metrics),
            "forward_tokens": statistics.mean(m["forward_tokens"] for m in metrics),
            "train_s": statistics.median(m["train_s"] for m in metrics),
            "train_s_range": [min(m["train_s"] for m in metrics), max(m["train_s"] for m in metrics)],
        }
    return summary


def table(results: dict[str, Any]) -> str:
    lines = [
        "| step shape | machine | tokens (as unshared) | tokens computed, shared | train time unshared | "
        "train time shared | speed-up | loss / gradient difference |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results.values():
        plain, shared, check = r["unshared"], r["shared"], r["agreement"]
        lines.append(
            f"| {r['shape']} | {r['machine']}, {r['date']} | {plain['tokens']:.0f} | {shared['forward_tokens']:.0f} "
            f"({shared['forward_tokens'] / plain['tokens']:.0%}) | {plain['train_s']:.1f} s | {shared['train_s']:.1f} s | "
            f"{plain['train_s'] / shared['train_s']:.2f}x | {check['loss_relative_difference']:.1e} / "
            f"{check['gradient_relative_gap']:.1e} |"
        )
    return (
        "One GRPO step of the packaged model (one trainer, no server), median of the timed steps; the "
        "difference columns compare the loss and gradients both ways from the same weights (relative):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="timed steps each way, main job's shape")
    parser.add_argument("--email-steps", type=int, default=1, help="timed steps each way, email shape (long)")
    parser.add_argument("--table-only", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = json.loads(SHARED_RESULTS.read_text()) if SHARED_RESULTS.exists() else {}
    if not args.table_only:
        torch.manual_seed(0)
        trainer = Trainer(resolve_base_model("smollm2-135m-instruct"), seed=0)
        trainer.add_adapter("bench", agentrl.LoRAConfig())
        precision = precision_label()
        machine = machine_label()
        for shape, make_groups, steps, warm_up in (
            ("main job (larger_number, 8 x 8)", main_job_groups, args.steps, True),
            ("email tool task (4 x 8, long prompt)", email_groups, args.email_steps, False),  # warm by now
        ):
            print(f"=== {shape} ===")
            result = measure(trainer, make_groups, steps, warm_up=warm_up)
            result.update(shape=shape, machine=machine, date=str(datetime.date.today()))
            results[f"{shape} | {precision}"] = result
            write_json_atomic(SHARED_RESULTS, results)
            print(json.dumps(result, indent=1))
    text = table(results)
    print(text)
    replace_section(START, END, f"{START}\n{text}{END}")


if __name__ == "__main__":
    main()
