"""LLM judges for tasks without a checkable answer: RULER (a group in one call) and the rubric judge;
checking a judge, auditing it while it trains, and judging with a trained one (training one:
`agentrl.judge_training`)."""

from agentrl.judges.audit import DEFAULT_AUDIT, JudgeAudit
from agentrl.judges.call import JudgeLimiter
from agentrl.judges.check import JudgeCheckReport, check_judge
from agentrl.judges.check_report import recorded_groups
from agentrl.judges.examples import (
    JudgeExample,
    VerdictExample,
    examples_from_groups,
    load_examples,
    load_verdict_examples,
    write_examples,
    write_verdict_examples,
)
from agentrl.judges.readout import Readout
from agentrl.judges.rubric import (
    RubricJudgement,
    RubricTask,
    audit_rubrics,
    judge_rubrics,
    load_rubric_tasks,
    rubric_rollout,
)
from agentrl.judges.ruler import DEFAULT_RUBRIC, RulerResult, ruler
from agentrl.judges.ruler_group import ruler_score_group
from agentrl.judges.trained import RUN_PREFIX, trained_judge

__all__ = [
    "DEFAULT_AUDIT",
    "DEFAULT_RUBRIC",
    "RUN_PREFIX",
    "Readout",
    "audit_rubrics",
    "examples_from_groups",
    "load_examples",
    "load_verdict_examples",
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
]
