"""Training a judge, a recipe on top of the training loop: a RULER judge by SFT or by RL on its agreement with
labels (`ruler_judge`), its decision alone (`decisions`), and a rubric judge's Yes/No verdict (`verdicts`). The
judges themselves, and the trained judge as a reward, are `agentrl.judges`."""

from agentrl.judge_training.ruler_judge import agreement_reward, judge_histories, train_judge, train_judge_rl
from agentrl.judge_training.verdicts import train_verdict_judge, verdict_accuracy

__all__ = [
    "agreement_reward",
    "judge_histories",
    "train_judge",
    "train_judge_rl",
    "train_verdict_judge",
    "verdict_accuracy",
]
