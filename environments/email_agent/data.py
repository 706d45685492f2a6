"""Deterministic inboxes with facts worth asking about, and questions whose answers are those facts.

Every inbox belongs to one person and holds threads with colleagues and outsiders: meeting moves,
invoices, flights, decisions, plus routine mail that answers nothing. Each fact-bearing email yields a
question, its short answer, and the id of the email that holds it. The same seed always gives the
same data; inboxes are split into train and test, so test questions are about mail never trained on.
"""

from __future__ import annotations

import datetime as dt
import random
from dataclasses import dataclass, field

FIRST_NAMES = [
    "Alice",
    "Bruno",
    "Chen",
    "Dana",
    "Elif",
    "Farid",
    "Grace",
    "Hiro",
    "Ines",
    "Jonas",
    "Kavya",
    "Liam",
    "Maya",
    "Nikolai",
    "Olga",
    "Priya",
    "Quinn",
    "Rosa",
    "Sami",
    "Tara",
    "Umar",
    "Vera",
    "Wen",
    "Yusuf",
]
LAST_NAMES = [
    "Adams",
    "Becker",
    "Costa",
    "Dubois",
    "Eriksen",
    "Fischer",
    "Garcia",
    "Haddad",
    "Ito",
    "Jensen",
    "Kowalski",
    "Lopez",
    "Moreau",
    "Novak",
    "Okafor",
    "Petrov",
    "Rossi",
    "Silva",
    "Tanaka",
    "Weber",
]
COMPANIES = ["northwind", "contoso", "fabrikam", "globex", "initech", "umbrella", "tailspin", "litware"]
PROJECTS = ["Atlas", "Beacon", "Cobalt", "Delta", "Ember", "Falcon", "Granite", "Harbor", "Ion", "Juniper"]
VENDORS = ["Acme Supplies", "Bright Logistics", "Crestline Print", "Dynamo Cloud", "Evergreen Catering"]
CITIES = ["Lisbon", "Osaka", "Denver", "Nairobi", "Oslo", "Montreal", "Seville", "Hanoi"]
AIRLINES = ["UA", "LH", "AF", "KL", "NH", "TP", "AC"]
WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday"]
ROUTINE = [
    ("Lunch on Friday?", "Anyone up for lunch on Friday? The new place on the corner opened."),
    ("Office closed for maintenance", "The office will be closed next Saturday for maintenance of the heating system."),
    ("Reminder: timesheets", "Please submit your timesheets by the end of the week."),
    ("Newsletter: team highlights", "This month we welcomed two new colleagues and finished the move to the new wiki."),
    ("Parking lot repainting", "The parking lot will be repainted on Sunday; please park on the street."),
]


@dataclass(frozen=True)
class Person:
    name: str
    address: str


@dataclass(frozen=True)
class Email:
    """One message in one inbox."""

    message_id: str
    inbox: str  # the owner's address
    thread_id: str
    subject: str
    body: str
    from_addr: str
    to_addrs: tuple[str, ...]
    sent_at: dt.datetime


@dataclass(frozen=True)
class Question:
    """A question about one inbox, its short answer, and the email(s) that hold the answer."""

    question_id: str
    inbox: str
    question: str
    answer: str
    source_ids: tuple[str, ...]


@dataclass
class Dataset:
    emails: list[Email] = field(default_factory=list)
    questions: list[Question] = field(default_factory=list)
    inboxes: list[str] = field(default_factory=list)

    def split(self, split: str) -> list[Question]:
        """Questions of the train or test inboxes (the last quarter of inboxes is test)."""
        cut = len(self.inboxes) - max(1, len(self.inboxes) // 4)
        chosen = set(self.inboxes[:cut] if split == "train" else self.inboxes[cut:])
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        return [q for q in self.questions if q.inbox in chosen]


def _person(rng: random.Random, company: str, used: set[str]) -> Person:
    while True:
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        address = f"{first.lower()}.{last.lower()}@{company}.com"
        if address not in used:
            used.add(address)
            return Person(f"{first} {last}", address)


def _fact_email(rng: random.Random, kind: str, sender: Person, owner: Person) -> tuple[str, str, str, str]:
    """(subject, body, question, answer) for one kind of fact."""
    project = rng.choice(PROJECTS)
    if kind == "meeting":
        day, hour, minute = rng.choice(WEEKDAYS), rng.randint(9, 16), rng.choice(["00", "15", "30", "45"])
        time_text = f"{hour % 12 or 12}:{minute} {'AM' if hour < 12 else 'PM'}"
        return (
            f"{project} review moved",
            f"Hi {owner.name.split()[0]},\n\nThe {project} design review is moved to "
            f"{day} at {time_text} in room {rng.randint(100, 499)}.\n\nBest,\n{sender.name}",
            f"When was the {project} design review moved to?",
            f"{day} at {time_text}",
        )
    if kind == "invoice":
        vendor, amount = rng.choice(VENDORS), f"${rng.randint(12, 980) * 25:,}"
        return (
            f"Invoice from {vendor}",
            f"Hello,\n\nThe invoice from {vendor} for project {project} comes to "
            f"{amount}, due at the end of the month.\n\nRegards,\n{sender.name}",
            f"How much is the invoice from {vendor}?",
            amount,
        )
    if kind == "flight":
        city, flight = rng.choice(CITIES), f"{rng.choice(AIRLINES)} {rng.randint(100, 999)}"
        return (
            f"Trip to {city}",
            f"Hi,\n\nYour trip to {city} is booked: flight {flight}, leaving "
            f"{rng.choice(WEEKDAYS)} morning. The hotel is near the conference centre.\n\n{sender.name}",
            f"What is the flight number for the trip to {city}?",
            flight,
        )
    vendor = rng.choice(VENDORS)
    return (
        f"Decision on {project} supplier",
        f"Team,\n\nAfter comparing the offers we decided to go with "
        f"{vendor} for {project}. Contracts follow next week.\n\n{sender.name}",
        f"Which supplier was chosen for {project}?",
        vendor,
    )


def generate(
    *, seed: int = 0, num_inboxes: int = 40, facts_per_inbox: int = 12, routine_per_inbox: int = 10
) -> Dataset:
    """A reproducible dataset: the same arguments always give the same emails and questions."""
    rng = random.Random(seed)
    data = Dataset()
    start = dt.datetime(2026, 3, 2, 8, 0)
    used: set[str] = set()
    for inbox_index in range(num_inboxes):
        company = COMPANIES[inbox_index % len(COMPANIES)]
        owner = _person(rng, company, used)
        colleagues = [_person(rng, company, used) for _ in range(5)]
        outsiders = [_person(rng, rng.choice(COMPANIES), used) for _ in range(3)]
        data.inboxes.append(owner.address)
        kinds = ["meeting", "invoice", "flight", "decision"]
        topics_seen: set[str] = set()
        messages: list[tuple[Email, tuple[str, str] | None]] = []
        for n in range(facts_per_inbox + routine_per_inbox):
            sender = rng.choice(colleagues + outsiders)
            sent_at = start + dt.timedelta(days=rng.randint(0, 60), hours=rng.randint(0, 9), minutes=rng.randint(0, 59))
            qa = None
            if n < facts_per_inbox:
                subject, body, question, answer = _fact_email(rng, kinds[n % len(kinds)], sender, owner)
                if question in topics_seen:  # one answer per question within an inbox
                    continue
                topics_seen.add(question)
                qa = (question, answer)
            else:
                subject, body = rng.choice(ROUTINE)
            message_id = f"<{inbox_index:02d}.{n:03d}@{company}.mail>"
            email = Email(
                message_id,
                owner.address,
                f"t{inbox_index:02d}-{n:03d}",
                subject,
                body,
                sender.address,
                (owner.address,),
                sent_at,
            )
            messages.append((email, qa))
        for email, qa in sorted(messages, key=lambda m: m[0].sent_at):
            data.emails.append(email)
            if qa is not None:
                data.questions.append(
                    Question(f"q-{email.message_id.strip('<>')}", owner.address, qa[0], qa[1], (email.message_id,))
                )
    return data
