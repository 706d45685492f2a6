"""LLM judges for tasks without a checkable answer: RULER (a group in one call) and the rubric judge;
checking a judge, auditing it while it trains, and training one."""

from agentrl.judges.audit import JudgeAudit
from agentrl.judges.call import JudgeLimiter
from agentrl.judges.check import JudgeCheckReport, check_judge
from agentrl.judges.examples import JudgeExample
from agentrl.judges.rubric import RubricJudgement, RubricTask, judge_rubrics, load_rubric_tasks, rubric_rollout
from agentrl.judges.ruler import DEFAULT_RUBRIC, RulerResult, ruler, ruler_score_group
from agentrl.judges.training import train_judge, train_judge_rl
from agentrl.judges.verdict_training import VerdictExample, train_verdict_judge

__all__ = [
    "DEFAULT_RUBRIC",
    "JudgeAudit",
    "JudgeCheckReport",
    "JudgeExample",
    "JudgeLimiter",
    "RubricJudgement",
    "RubricTask",
    "RulerResult",
    "VerdictExample",
    "check_judge",
    "judge_rubrics",
    "load_rubric_tasks",
    "rubric_rollout",
    "ruler",
    "ruler_score_group",
    "train_judge",
    "train_judge_rl",
    "train_verdict_judge",
]
