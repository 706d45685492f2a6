"""The tool-use task's agent written with two agent frameworks, each a program of its own that knows only a base
URL (OPENAI_BASE_URL, OPENAI_API_KEY): trained through a rollout session by `..frameworks`."""
