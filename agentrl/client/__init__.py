"""Floor 6, the client: what a user's script calls (the model, its backend protocol and HTTP client, capture,
gather, the pipeline, datasets, Weave tracing); never torch, transformers, peft or vLLM."""
