"""Code that runs inside vLLM's own processes, loaded through vLLM's plugin entry points.

Its own top-level package so that vLLM's processes import only this (not agentrl and its
dependencies). `lora_ops`: grouped CPU LoRA ops; `engine_fork`: the CPU engine process forked, not
spawned; `logprob_ranks`: sampled tokens' ranks counted without torch.compile; `grammar_logprobs`: logprobs
under a grammar taken before its mask; `quiet_tool_parsers`: an unparsable tool call one log line;
`call_whitespace`: whitespace inside a tool call's JSON capped;
`server_guard`: the bearer-key middleware vLLM loads through
`--middleware`; `zygote`: vLLM imported once and CPU servers forked from it.
"""
