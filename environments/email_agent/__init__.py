"""The email agent (ART-E style): data, SQLite FTS5 mailbox, tools, rollout, reward, warm start."""
