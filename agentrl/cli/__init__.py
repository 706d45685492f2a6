"""The `agentrl` command: train and evaluate the shipped environments, inspect and serve runs.

agentrl train 2048 [--preset cpu|gpu] [--steps N] [--model ...]
agentrl train email --reward ruler [--judge openai/o4-mini] [--judge-readout probabilities|json]
agentrl train larger-number --reward ruler --judge run:NAME   the main job's task with its check hidden
agentrl train rubric [--reward rubric|ruler|ruler-generic] [--tasks FILE]   instruction following, judged only
agentrl eval 2048 [--name RUN] [--preset cpu|gpu]
agentrl runs                      list runs: step, best reward, path
agentrl show PROJECT/NAME         a run's metrics per step, and where its transcripts and plot are
agentrl serve PROJECT/NAME [--step N]   an OpenAI-compatible endpoint with that checkpoint
agentrl backend serve [--host H] [--port P]   a backend service for `RemoteBackend` (train from another host)
agentrl judge check PROJECT/NAME [--judge MODEL ...]   can a judge be trusted? agreement, bias, repeatability, cost
agentrl judge examples PROJECT/NAME --out FILE   labelled judge examples from a run whose groups kept a check
agentrl judge train NAME --examples FILE [--held-out FILE] [--rl-steps N]   a judge of your own; then --judge run:NAME
agentrl doctor                    check the installation and say what to fix
agentrl --version                 the installed version
"""

import importlib

from agentrl.cli.app import app, main

for _group in ("train", "runs", "backend", "judge", "doctor"):  # each registers its commands on `app`, in help order
    importlib.import_module(f"agentrl.cli.{_group}")

__all__ = ["app", "main"]
