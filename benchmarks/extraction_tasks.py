"""Extraction tasks in the families users extract, for ``python -m benchmarks quality --source families``.

Each case is a short passage in everyday prose that states every value of a record, and a
request for that record as JSON. Seven families cover what users extract:

- ``person``: name, age, city;
- ``product``: product name, price (a float), in stock (a boolean);
- ``event``: title, date (ISO in the JSON; written ISO or in words in the prose), attendees;
- ``flags``: a support ticket's customer and three yes/no flags;
- ``category``: a review's product category and sentiment (enums) and its rating;
- ``list``: a shopping list's owner and its items (an array of strings, in the order stated);
- ``nested``: an order with a customer object (name, email) and a total.

Half of the prompts name the fields they want ("... with the keys name, age and city"); the
others only ask for the record, the way a client that sends the schema in ``response_format``
asks. Case ids are ``family-NNNN``; ``split_of`` puts each in ``tune`` or ``report`` by a hash of
its id, and every choice a case makes is seeded by its id, so the same id always gives the same
passage, prompt and answer.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

from .quality_tasks import Task, leaves, split_of

FIRST = ("Maria", "James", "Aiko", "Olu", "Priya", "Lukas", "Sofia", "Mateo", "Chen", "Fatima", "Noah", "Elena",
         "Kwame", "Ingrid", "Ravi", "Lucia", "Tomas", "Amara", "Hugo", "Yuki", "Omar", "Clara", "Dmitri", "Zoe")
LAST = ("Lopez", "Smith", "Tanaka", "Adeyemi", "Sharma", "Becker", "Rossi", "Garcia", "Wang", "Haddad", "Miller",
        "Petrova", "Mensah", "Larsen", "Iyer", "Fernandez", "Novak", "Okafor", "Dubois", "Sato", "Khan", "Weber")
CITIES = ("Madrid", "Chicago", "Osaka", "Lagos", "Pune", "Hamburg", "Turin", "Seville", "Chengdu", "Beirut",
          "Denver", "Sofia", "Accra", "Bergen", "Chennai", "Lima", "Prague", "Enugu", "Lyon", "Sapporo", "Karachi",
          "Vienna", "Kyiv", "Auckland", "Porto", "Boston", "Glasgow", "Quito")
PRODUCTS = ("wireless mouse", "standing desk", "espresso machine", "hiking backpack", "desk lamp", "yoga mat",
            "electric kettle", "mechanical keyboard", "office chair", "rain jacket", "blender", "bike helmet",
            "water bottle", "noise-cancelling headphones", "cast iron pan", "garden hose", "air purifier",
            "phone charger", "travel mug", "bookshelf")
EVENTS = ("Spring Gala", "Data Science Meetup", "Charity Run", "Jazz Night", "Open Source Summit", "Book Fair",
          "Harvest Festival", "Robotics Workshop", "Film Screening", "Science Fair", "Winter Market", "Chess Open",
          "Poetry Evening", "Startup Pitch Day", "Photography Walk", "Community Cleanup")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
CATEGORIES = ("electronics", "clothing", "books", "home", "sports", "toys")
SENTIMENTS = ("positive", "negative", "neutral")
ITEMS = ("milk", "eggs", "bread", "apples", "rice", "coffee", "butter", "onions", "cheese", "tomatoes", "pasta",
         "yogurt", "carrots", "honey", "beans", "lemons", "spinach", "flour")
FAMILIES = ("person", "product", "event", "flags", "category", "list", "nested")

NAMED_PROMPTS = ("{text}\n\nExtract the {what} from the text above as JSON with the keys {keys}.",
                 "Read this:\n{text}\n\nReturn a JSON object with {keys}.",
                 "Text: {text}\nGive me the {what} as JSON ({keys}).")
SCHEMA_PROMPTS = ("{text}\n\nExtract the {what} from the text above as JSON.",
                  "Read this:\n{text}\n\nReturn the {what} as a JSON object.",
                  "Text: {text}\nGive me the {what} as JSON.")
TERSE_PROMPTS = ("{text} Extract the {what}.", "{text}\n\nWhat is the {what}?", "{text} Give me the {what}.")
"""The ``terse`` source's prompts: the record asked for without saying JSON, as README's examples ask."""


def _strict(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties), "additionalProperties": False}


def _name(rng: random.Random) -> str:
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def _person(rng: random.Random) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    name, age, city = _name(rng), rng.randint(18, 92), rng.choice(CITIES)
    text = rng.choice((f"{name} is {age} years old and lives in {city}.",
                       f"{name}, {age}, moved to {city} last year.",
                       f"Meet {name}: a {age}-year-old teacher from {city}.",
                       f"Our new neighbour, {name}, comes from {city}. She turned {age} in May."))
    schema = _strict({"name": {"type": "string"}, "age": {"type": "integer"}, "city": {"type": "string"}})
    return "person", text, schema, {"name": name, "age": age, "city": city}


def _product(rng: random.Random) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    product, stock = rng.choice(PRODUCTS), rng.random() < 0.5
    price = round(rng.randint(3, 400) + rng.choice((0.0, 0.5, 0.99, 0.25, 0.75)), 2)
    shown = f"{price:.2f}"
    availability = rng.choice(("It is in stock.", "Available now.")) if stock else \
        rng.choice(("It is out of stock.", "Currently sold out."))
    text = rng.choice((f"The {product} costs ${shown}. {availability}",
                       f"{availability} Our {product} sells for {shown} dollars.",
                       f"Item: {product}. Price: ${shown}. {availability}"))
    schema = _strict({"product": {"type": "string"}, "price": {"type": "number"}, "in_stock": {"type": "boolean"}})
    return "product", text, schema, {"product": product, "price": price, "in_stock": stock}


def _event(rng: random.Random) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    title, year, month, day = rng.choice(EVENTS), rng.randint(2015, 2027), rng.randint(1, 12), rng.randint(1, 28)
    attendees = rng.randint(12, 2500)
    iso = f"{year:04d}-{month:02d}-{day:02d}"
    when = iso if rng.random() < 0.5 else f"{MONTHS[month - 1]} {day}, {year}"
    text = rng.choice((f"The {title} took place on {when} and drew {attendees} attendees.",
                       f"{attendees} people came to the {title} on {when}.",
                       f"Save the date: {title}, {when}. We expect {attendees} guests."))
    schema = _strict({"title": {"type": "string"}, "date": {"type": "string", "format": "date"},
                      "attendees": {"type": "integer"}})
    return "event", text, schema, {"title": title, "date": iso, "attendees": attendees}


def _flags(rng: random.Random) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    customer = _name(rng)
    urgent, refund, repeat = (rng.random() < 0.5 for _ in range(3))
    sentences = [f"Ticket from {customer}.",
                 "This is urgent." if urgent else "It is not urgent.",
                 "They ask for a refund." if refund else "They do not want a refund.",
                 "They have contacted us before." if repeat else "This is their first contact."]
    head, rest = sentences[0], sentences[1:]
    rng.shuffle(rest)
    schema = _strict({"customer": {"type": "string"}, "urgent": {"type": "boolean"},
                      "refund_requested": {"type": "boolean"}, "returning_customer": {"type": "boolean"}})
    return "flags", " ".join([head, *rest]), schema, {"customer": customer, "urgent": urgent,
                                                      "refund_requested": refund, "returning_customer": repeat}


def _category(rng: random.Random) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    category, sentiment, rating = rng.choice(CATEGORIES), rng.choice(SENTIMENTS), rng.randint(1, 5)
    mood = {"positive": "I loved it", "negative": "I was disappointed", "neutral": "It was okay, nothing special"}
    text = rng.choice((f"Review of a {category} purchase: {mood[sentiment]}. Rating: {rating} out of 5. "
                       f"Sentiment: {sentiment}.",
                       f"Category: {category}. {mood[sentiment]}, so I give it {rating} stars "
                       f"(overall {sentiment}).",
                       f"{mood[sentiment]}. {rating}/5. This was in the {category} section; "
                       f"my feeling is {sentiment}."))
    schema = _strict({"category": {"enum": list(CATEGORIES)}, "sentiment": {"enum": list(SENTIMENTS)},
                      "rating": {"type": "integer", "minimum": 1, "maximum": 5}})
    return "category", text, schema, {"category": category, "sentiment": sentiment, "rating": rating}


def _list(rng: random.Random) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    owner, items = rng.choice(FIRST), rng.sample(ITEMS, rng.randint(2, 4))
    listed = ", ".join(items[:-1]) + f" and {items[-1]}"
    text = rng.choice((f"{owner} needs to buy {listed}.",
                       f"Shopping list for {owner}: {', '.join(items)}.",
                       f"{owner} asked me to pick up {listed} on the way home."))
    schema = _strict({"owner": {"type": "string"}, "items": {"type": "array", "items": {"type": "string"}}})
    return "list", text, schema, {"owner": owner, "items": items}


def _nested(rng: random.Random) -> tuple[str, str, dict[str, Any], dict[str, Any]]:
    first, last = rng.choice(FIRST), rng.choice(LAST)
    email = f"{first.lower()}.{last.lower()}@example.com"
    total = round(rng.randint(5, 900) + rng.choice((0.0, 0.5, 0.99, 0.2)), 2)
    text = rng.choice((f"Order placed by {first} {last} ({email}) for a total of ${total:.2f}.",
                       f"{first} {last} paid {total:.2f} dollars. Contact: {email}.",
                       f"Customer: {first} {last}, email {email}. Order total: ${total:.2f}."))
    customer = _strict({"name": {"type": "string"}, "email": {"type": "string"}})
    schema = _strict({"customer": customer, "total": {"type": "number"}})
    return "nested", text, schema, {"customer": {"name": f"{first} {last}", "email": email}, "total": total}


_BUILDERS: dict[str, Callable[[random.Random], tuple[str, str, dict[str, Any], dict[str, Any]]]] = {
    "person": _person, "product": _product, "event": _event, "flags": _flags, "category": _category,
    "list": _list, "nested": _nested,
}
_WHAT = {"person": "person", "product": "product", "event": "event", "flags": "ticket", "category": "review",
         "list": "shopping list", "nested": "order"}


def _keys(record: dict[str, Any]) -> str:
    """``name, age and city``; a nested object reads ``customer (name, email)``."""
    names = [f"{key} ({', '.join(value)})" if isinstance(value, dict) else key for key, value in record.items()]
    return ", ".join(names[:-1]) + f" and {names[-1]}"


def family_task(case_id: str, terse: bool = False) -> Task:
    """The task of one case id (``"person-0007"``), the same every time; ``terse``: the same passage
    asked for in one of ``TERSE_PROMPTS``."""
    family = case_id.rsplit("-", 1)[0]
    if family not in _BUILDERS:
        raise ValueError(f"unknown family in {case_id!r}; families: {', '.join(FAMILIES)}")
    rng = random.Random(case_id)
    _, text, schema, record = _BUILDERS[family](rng)
    named = rng.random() < 0.5
    template = rng.choice(NAMED_PROMPTS if named else SCHEMA_PROMPTS)
    if terse:
        template, named = rng.choice(TERSE_PROMPTS), False
    prompt = template.format(text=text, what=_WHAT[family], keys=_keys(record))
    return Task(case_id, "extract", prompt, schema, leaves(record), source=f"{family}/{'named' if named else 'schema'}")


def family_tasks(split: str, cases: int, families: tuple[str, ...] = FAMILIES, terse: bool = False) -> list[Task]:
    """``cases`` tasks of ``split``, spread evenly over ``families`` (interleaved by family); ``terse``:
    in ``TERSE_PROMPTS``."""
    per_family = -(-cases // len(families))
    chosen: dict[str, list[Task]] = {f: [] for f in families}
    for family in families:
        number = 0
        while len(chosen[family]) < per_family:
            case_id = f"{family}-{number:04d}"
            number += 1
            if split_of(case_id) == split:
                chosen[family].append(family_task(case_id, terse))
    interleaved = [chosen[f][i] for i in range(per_family) for f in families]
    return interleaved[:cases]
