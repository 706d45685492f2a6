"""vLLM's OpenAI API server, ended without the interpreter's teardown: `python -m agentrl_vllm.api_server ARGS`.

The server process imports Triton (vLLM checks for it even on a CPU), and Triton's nanobind bindings hold
objects past their module's end, so every server that exited through Python's teardown wrote "nanobind: leaked
... instances/types/functions" (some 40 lines) to the end of its log, the lines a reader of a crashed run sees
last. Here the server runs vLLM's own entry point, then its exit handlers (logging flushed, vLLM's own
clean-up), then leaves with its exit code before the teardown that reports them. The zygote's forked servers
end the same way (`agentrl_vllm.zygote`).
"""

from __future__ import annotations

import atexit
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn

VLLM_MODULE = "vllm.entrypoints.openai.api_server"
"""The module `python -m` would run, and the name the server gives itself in `sys.argv[0]`."""


def serve_then_exit(prepare: Callable[[], None] = lambda: None) -> NoReturn:
    """Run `prepare` and vLLM's API server; exit with the server's code, whatever happens, without the teardown."""
    import os

    code = 1
    try:
        prepare()
        from vllm.entrypoints.launchers.api_server.entry import main

        main()  # type: ignore[no-untyped-call]
        code = 0
    except SystemExit as error:
        code = error.code if isinstance(error.code, int) else (0 if error.code is None else 1)
    except BaseException:  # noqa: BLE001 -- into the server's log, and its exit code says it failed
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


if __name__ == "__main__":
    sys.argv[0] = VLLM_MODULE
    serve_then_exit()
