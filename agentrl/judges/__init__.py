"""LLM judges for tasks without a checkable answer: RULER (a group in one call) and the rubric judge;
checking a judge, auditing it while it trains, and training one."""

from agentrl.judges.audit import DEFAULT_AUDIT, JudgeAudit
from agentrl.judges.call import JudgeLimiter
from agentrl.judges.check import JudgeCheckReport, check_judge
from agentrl.judges.check_report import recorded_groups
from agentrl.judges.examples import JudgeExample, examples_from_groups, load_examples, write_examples
from agentrl.judges.readout import Readout
from agentrl.judges.rubric import (
    RubricJudgement,
    RubricTask,
    audit_rubrics,
    judge_rubrics,
    load_rubric_tasks,
    rubric_rollout,
)
from agentrl.judges.ruler import DEFAULT_RUBRIC, RulerResult, ruler, ruler_score_group
from agentrl.judges.training import RUN_PREFIX, train_judge, train_judge_rl, trained_judge
from agentrl.judges.verdict_training import VerdictExample, train_verdict_judge, write_verdict_examples

__all__ = [
    "DEFAULT_AUDIT",
    "DEFAULT_RUBRIC",
    "RUN_PREFIX",
    "Readout",
    "audit_rubrics",
    "examples_from_groups",
    "load_examples",
    "recorded_groups",
    "trained_judge",
    "write_examples",
    "write_verdict_examples",
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
