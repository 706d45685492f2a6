"""The inference side of a local backend: vLLM server processes and their replicas."""
