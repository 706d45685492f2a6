"""A rubric judge you train: one rubric's verdict on one response, labelled by a check, taught by SFT on
the one Yes/No token that `judge_rubrics(..., readout="probabilities")` reads (`rubric.verdict_prompt`).

Data: JSONL, one `VerdictExample` a line (`agentrl.judges.examples`: task prompt, response, rubric, whether the
check passed), e.g. every code-checkable rubric of a task's sampled answers. `agentrl judge train NAME --kind
rubric` trains on it; `--reward rubric --judge run:NAME` then judges with it, read from probabilities.
"""

from __future__ import annotations

import asyncio
import random
import statistics

from agentrl.client.backend_protocol import TrainResult
from agentrl.client.model import TrainableModel
from agentrl.data.trajectory import History
from agentrl.foundation.config import SFTConfig
from agentrl.foundation.errors import ConfigurationError
from agentrl.judge_training.decisions import decision_choices
from agentrl.judges.examples import VerdictExample
from agentrl.judges.readout import decision_call
from agentrl.judges.rubric import VERDICTS
from agentrl.judges.trained import record_readout


async def train_verdict_judge(
    judge: TrainableModel, examples: list[VerdictExample], config: SFTConfig | None = None, *, seed: int = 0
) -> TrainResult:
    """SFT a registered judge model on `examples`: each verdict prompt answered by exactly the Yes or No token
    the judge's server emits (`decision_choices`), the loss on that token alone, shuffled with `seed`."""
    if not examples:
        raise ConfigurationError(
            "no verdict examples: give a JSONL of VerdictExample lines (prompt, response, rubric, passed)"
        )
    record_readout(judge, "probabilities", kind="rubric")
    choices = await decision_choices(judge, VERDICTS)
    histories = [
        History(messages_and_choices=[*e.messages(), choices[VERDICTS[0] if e.passed else VERDICTS[1]]])
        for e in examples
    ]
    random.Random(seed).shuffle(histories)
    return await judge.train_sft(histories, config or SFTConfig())


async def verdict_accuracy(judge: TrainableModel, examples: list[VerdictExample]) -> dict[str, float]:
    """The judge's verdicts on `examples`, read from probabilities: accuracy, accuracy on the passing and on the
    failing ones (a judge that always says Yes scores 1 and 0 there), and the mean P(Yes) of each."""
    calls = await asyncio.gather(*(decision_call(judge, e.messages(), VERDICTS) for e in examples))
    p_yes = [call.probabilities[VERDICTS[0]] for call in calls]
    right = [float((p >= 0.5) == e.passed) for p, e in zip(p_yes, examples)]
    passing = [k for k, e in enumerate(examples) if e.passed]
    failing = [k for k, e in enumerate(examples) if not e.passed]

    def mean_of(values: list[float], indices: list[int]) -> float:
        return statistics.fmean(values[k] for k in indices) if indices else float("nan")

    return {
        "accuracy": statistics.fmean(right),
        "accuracy_passing": mean_of(right, passing),
        "accuracy_failing": mean_of(right, failing),
        "p_yes_passing": mean_of(p_yes, passing),
        "p_yes_failing": mean_of(p_yes, failing),
        "n": float(len(examples)),
    }
