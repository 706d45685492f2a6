"""The trainer: a frozen base model with one LoRA adapter per model, its GRPO and SFT steps, and its ranks."""
