#!/usr/bin/env python3
"""Builds recipes/data/shakespeare.jsonl from /work/shared/data/shakespeare.jsonl.

Why: the repository must train out of a fresh clone, so it carries a small corpus. Whole plays
are ~150 KB each, so ten plays would be only ten documents and Megatron's "969,30,1" split would
leave validation empty; each play is therefore cut at blank lines into documents of about 8 KB,
which gives the split (and document shuffling) something to work with.

Usage: python3 tools/data/make_shakespeare_fixture.py SOURCE.jsonl OUTPUT.jsonl
"""
import json
import sys

PLAYS = [
    "hamlet", "macbeth", "romeo_and_juliet", "tempest", "midsummer_nights_dream",
    "lear", "othello", "julius_caesar", "sonnets", "twelfth_night",
]
CHUNK_CHARS = 8000


def chunks(text):
    part = []
    size = 0
    for paragraph in text.split("\n\n"):
        part.append(paragraph)
        size += len(paragraph) + 2
        if size >= CHUNK_CHARS:
            yield "\n\n".join(part)
            part, size = [], 0
    if part:
        yield "\n\n".join(part)


def main(source, output):
    plays = {}
    with open(source, encoding="utf-8") as f:
        for line in f:
            doc = json.loads(line)
            plays[doc["title"]] = doc["text"]
    with open(output, "w", encoding="utf-8") as out:
        for title in PLAYS:
            for n, text in enumerate(chunks(plays[title]), start=1):
                out.write(json.dumps({"title": f"{title} ({n})", "text": text}, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
