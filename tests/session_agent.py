"""An agent program that knows only a base URL (OPENAI_BASE_URL, OPENAI_API_KEY): two turns, the
second streamed. Run by tests/client/test_capture.py as a separate process on a rollout session."""

import sys

import openai

client = openai.OpenAI()  # the base URL and key come from the environment, as for any OpenAI program
model = sys.argv[1]
messages = [{"role": "user", "content": "Name a fruit."}]
first = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=1.0)
messages += [
    {"role": "assistant", "content": first.choices[0].message.content},
    {"role": "user", "content": "Another."},
]
stream = client.chat.completions.create(model=model, messages=messages, max_tokens=8, temperature=1.0, stream=True)
print("".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices))
