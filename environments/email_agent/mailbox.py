"""The mailbox: SQLite with an FTS5 index over subject and body, every query bound to one inbox.

All SQL is parameterised. The model's keywords never reach FTS5 as syntax: each word becomes a
quoted FTS5 string, so `OR`, `NEAR`, `*`, quotes and `--` are searched for as text. A search that
still fails returns no results rather than ending the rollout.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path

from .data import Dataset

SCHEMA = """
CREATE TABLE messages (
    rowid INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL UNIQUE,
    inbox TEXT NOT NULL,
    thread_id TEXT NOT NULL,
    subject TEXT NOT NULL,
    body TEXT NOT NULL,
    from_addr TEXT NOT NULL,
    sent_at TEXT NOT NULL
);
CREATE TABLE recipients (message_id TEXT NOT NULL REFERENCES messages(message_id), addr TEXT NOT NULL);
CREATE INDEX messages_inbox ON messages(inbox, sent_at);
CREATE INDEX recipients_addr ON recipients(addr);
CREATE VIRTUAL TABLE messages_fts USING fts5(subject, body, content='messages', content_rowid='rowid');
"""


def build_database(data: Dataset, path: Path) -> Path:
    """Write `data` to a new SQLite file at `path`, atomically (a temporary file renamed into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    os.close(fd)
    try:
        with sqlite3.connect(tmp_name) as db:
            db.executescript(SCHEMA)
            for email in data.emails:
                cursor = db.execute(
                    "INSERT INTO messages (message_id, inbox, thread_id, subject, body, from_addr, sent_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        email.message_id,
                        email.inbox,
                        email.thread_id,
                        email.subject,
                        email.body,
                        email.from_addr,
                        email.sent_at.isoformat(),
                    ),
                )
                db.execute(
                    "INSERT INTO messages_fts (rowid, subject, body) VALUES (?, ?, ?)",
                    (cursor.lastrowid, email.subject, email.body),
                )
                db.executemany("INSERT INTO recipients VALUES (?, ?)", [(email.message_id, a) for a in email.to_addrs])
        os.replace(tmp_name, path)
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return path


def fts_query(keywords: str) -> str | None:
    """FTS5 query matching emails that contain all the words; None when there are no words."""
    words = re.findall(r"\w+", keywords)
    return " ".join('"' + w.replace('"', '""') + '"' for w in words) or None


@dataclass(frozen=True)
class SearchHit:
    message_id: str
    subject: str
    from_addr: str
    sent_at: str
    snippet: str


class Mailbox:
    """Read-only access to one inbox of the database."""

    def __init__(self, database: Path, inbox: str) -> None:
        self.db = sqlite3.connect(f"file:{database}?mode=ro", uri=True, check_same_thread=False)
        self.inbox = inbox

    def close(self) -> None:
        self.db.close()

    def search(
        self,
        keywords: str,
        *,
        from_addr: str | None = None,
        to_addr: str | None = None,
        sent_after: str | None = None,
        sent_before: str | None = None,
        max_results: int = 10,
    ) -> list[SearchHit]:
        """Emails of this inbox matching every keyword and filter, newest first."""
        query = fts_query(keywords)
        if query is None:
            return []
        sql = [
            "SELECT m.message_id, m.subject, m.from_addr, m.sent_at, snippet(messages_fts, 1, '', '', ' ... ', 12)",
            "FROM messages_fts JOIN messages m ON m.rowid = messages_fts.rowid",
            "WHERE messages_fts MATCH ? AND m.inbox = ?",
        ]
        params: list[object] = [query, self.inbox]
        if from_addr:
            sql.append("AND m.from_addr = ?")
            params.append(from_addr.strip().lower())
        if to_addr:
            sql.append("AND m.message_id IN (SELECT message_id FROM recipients WHERE addr = ?)")
            params.append(to_addr.strip().lower())
        for bound, op in ((sent_after, ">="), (sent_before, "<")):
            if bound:
                try:
                    params.append(dt.datetime.fromisoformat(bound.strip()).isoformat())
                except ValueError:
                    return []  # an unreadable date matches nothing
                sql.append(f"AND m.sent_at {op} ?")
        sql.append("ORDER BY m.sent_at DESC LIMIT ?")
        params.append(max(1, min(int(max_results), 50)))
        try:
            rows = self.db.execute(" ".join(sql), params).fetchall()
        except sqlite3.Error:
            return []
        return [SearchHit(*row) for row in rows]

    def read(self, message_id: str) -> dict[str, str] | None:
        """One email of this inbox, or None (also for an id from another inbox)."""
        row = self.db.execute(
            "SELECT message_id, subject, from_addr, sent_at, body FROM messages WHERE message_id = ? AND inbox = ?",
            (message_id.strip(), self.inbox),
        ).fetchone()
        if row is None:
            return None
        keys = ("message_id", "subject", "from", "date", "body")
        return dict(zip(keys, row))
