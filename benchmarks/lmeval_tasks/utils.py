"""LAMBADA passages in text8's alphabet (a-z and space): the last word is the target, the 40 characters of words
before it the context (a text8-prefix model of this benchmark has 64 positions)."""

import re


def _doc(doc):
    words = re.sub("[^a-z ]", "", doc["text"].lower().replace("-", " ")).split()
    context = " ".join(words[:-1])[-40:]
    return {"context": context[context.find(" ") + 1 :] if " " in context else context, "target": words[-1]}


def process_docs(dataset):
    return dataset.map(_doc)
