"""Floor 3, the data: what a rollout records (messages and choices, trajectories, groups, tool-call text); they
import only the foundation."""
