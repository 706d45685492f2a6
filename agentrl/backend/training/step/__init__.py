"""A step's maths on the device: forward (fused LoRA, attention, chunked logprobs), loss, gradients, memory."""
