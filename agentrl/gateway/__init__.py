"""The inference gateway: one OpenAI-compatible door in front of the backend's vLLM server."""
