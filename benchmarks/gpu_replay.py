"""Does a recorded GRPO step replay byte for byte on a GPU, and what do deterministic kernels cost?

    python -m benchmarks.gpu_replay [--models smollm2-135m,qwen2.5-1.5b] [--deterministic] [--packaged DIR]

Each model (its architecture with random weights, as in `benchmarks.gpu_train`: no hub needed) trains
four steps of `gpu_train`'s agent groups (8 x 8 rollouts, 768-token shared prompt, 256-token answers;
KL 0.05 on even steps) through agentrl's own trainer start (`LocalBackend(deterministic=...)`'s), each
checkpoint saved with its step input as the backend saves it; then `agentrl replay`'s `replay_step`
trains step 4 again from checkpoint 3 in a fresh trainer. Run it once without and once with
`--deterministic` (a process-wide setting). Adds each row to benchmarks/results/gpu_replay.json.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import agentrl
from agentrl.backend.training.placement import TrainerPlacement, start_trainer
from agentrl.backend.training.replay.replay import replay_step
from agentrl.backend.training.step_input import StepInput, write_step_input
from agentrl.foundation.base_models import resolve_base_model
from agentrl.foundation.files import write_json_atomic
from agentrl.records.checkpoints import STEP_INPUT_FILE, CheckpointStore
from benchmarks.gpu_train import GPU_RESULTS, agent_groups, build_model

REPLAY_RESULTS = GPU_RESULTS.with_name("gpu_replay.json")
STEPS = 4


def measure(name: str, path: Path, run_dir: Path, deterministic: bool) -> dict[str, Any]:
    trainer: Any = start_trainer(str(path), TrainerPlacement(device="cuda", deterministic=deterministic))
    trainer.add_adapter("default", agentrl.LoRAConfig())
    store = CheckpointStore(run_dir)
    store.save(0, functools.partial(trainer.save, "default"), {"metrics": {}})
    step_s = []
    for step in range(1, STEPS + 1):
        groups = agent_groups(trainer.tokenizer, step)
        config = agentrl.TrainConfig(learning_rate=1e-4, kl_coef=0.05 if step % 2 == 0 else 0.0)
        torch.cuda.synchronize()
        started = time.perf_counter()
        outcome = trainer.train_step("default", groups, config)
        torch.cuda.synchronize()
        step_s.append(round(time.perf_counter() - started, 3))
        assert outcome.conditions is not None, "every step of this benchmark updates"
        trained_on = StepInput(groups, config, outcome.conditions)

        def write(folder: Path, trained_on: StepInput = trained_on) -> None:
            trainer.save("default", folder)
            write_step_input(folder, trained_on)

        store.save(step, write, {"metrics": outcome.metrics})
    started = time.perf_counter()
    report = replay_step(run_dir, STEPS)
    return {
        "model": name,
        "deterministic": deterministic,
        "identical": report.identical,
        "largest_difference": report.largest_difference,
        "largest_difference_in": report.largest_difference_in,
        "differing_conditions": {k: list(v) for k, v in report.differing_conditions.items()},
        "conditions": outcome.conditions.as_record(),
        "replay_s": round(time.perf_counter() - started, 1),
        "step_s": step_s,
        "tokens_per_step": outcome.metrics["total_tokens"],
        "step_input_bytes": (store.path(STEPS) / STEP_INPUT_FILE).stat().st_size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="smollm2-135m,qwen2.5-1.5b")
    parser.add_argument("--deterministic", action="store_true", help="LocalBackend(deterministic=True)'s kernels")
    parser.add_argument("--out", type=Path, default=REPLAY_RESULTS)
    parser.add_argument("--packaged", help="a folder with the packaged model's config.json and tokenizer files")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit(
            "benchmarks.gpu_replay needs a CUDA GPU; on a CPU, tests/backend/training/replay/test_replay.py replays steps"
        )
    results: dict[str, Any] = json.loads(args.out.read_text()) if args.out.exists() else {}
    packaged = args.packaged or resolve_base_model("smollm2-135m-instruct")
    gpu = torch.cuda.get_device_name()
    with tempfile.TemporaryDirectory() as folder:
        for name in args.models.split(","):
            path = build_model(name, Path(folder), packaged)
            row = measure(name, path, Path(folder) / f"run-{name}", args.deterministic)
            row.update(gpu=gpu, date=str(datetime.date.today()), torch=torch.__version__)
            results[f"{name} | {'deterministic' if args.deterministic else 'default'} | {gpu}"] = row
            write_json_atomic(args.out, results)
            print(json.dumps(row), flush=True)
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
