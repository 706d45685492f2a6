"""What a run leaves on disk, read and written in one place: its folder's layout (`run_folder`), checkpoints
(`checkpoints`), each step's record and metrics (`step_record`, `tracking`, `wandb_metrics`), the scenarios each
step consumed (`scenario_record`), and the runs found under a base path (`runs`). Below the client and the
backend: both read and write records, and nothing here imports either."""

from agentrl.records.checkpoints import CheckpointStore
from agentrl.records.run_folder import RunFolder
from agentrl.records.step_metrics import summarize
from agentrl.records.tracking import load_trajectories, read_metrics

__all__ = ["CheckpointStore", "RunFolder", "load_trajectories", "read_metrics", "summarize"]
