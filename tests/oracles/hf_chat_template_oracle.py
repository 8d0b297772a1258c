#!/usr/bin/env python3
"""The test oracle for src/data/chat_template: renders chat templates with Python's Jinja2 in the
environment Hugging Face's apply_chat_template builds (transformers' chat template utilities):
an immutable sandbox with trim_blocks and lstrip_blocks, the loopcontrols extension, a
`{% generation %}` tag that records the span its body renders, a tojson filter that is
json.dumps(ensure_ascii=False), and the globals raise_exception and strftime_now.

Usage: hf_chat_template_oracle.py CASES.json > RESULTS.json
CASES.json is a list of {"template": str, "variables": {...}}; each result is
{"text": str, "spans": [[begin, end], ...]} with the spans in UTF-8 bytes of text, or
{"error": str} when rendering raised.
"""
import json
import sys
from datetime import datetime

import jinja2
from jinja2 import nodes
from jinja2.exceptions import TemplateError
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class GenerationSpans(Extension):
    """{% generation %}...{% endgeneration %}: renders its body and records where it landed in the
    output rendered so far (the chunks the template's generator has yielded)."""

    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        self.chunks = None
        self.spans = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_record"), [], [], body).set_lineno(lineno)

    def _record(self, caller):
        text = caller()
        if self.chunks is not None:
            begin = len("".join(self.chunks))
            self.spans.append((begin, begin + len(text)))
        return text


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise TemplateError(message)


def strftime_now(fmt):
    return datetime.now().strftime(fmt)


def make_environment():
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationSpans, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, case):
    tracker = next(e for e in env.extensions.values() if isinstance(e, GenerationSpans))
    tracker.chunks, tracker.spans = [], []
    try:
        template = env.from_string(case["template"])
        for chunk in template.generate(**case["variables"]):
            tracker.chunks.append(chunk)
        text = "".join(tracker.chunks)
        spans = [[len(text[:b].encode()), len(text[:e].encode())] for b, e in tracker.spans]
        return {"text": text, "spans": spans}
    except Exception as e:  # the oracle reports, the C++ test decides
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        tracker.chunks, tracker.spans = None, None


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        cases = json.load(f)
    env = make_environment()
    json.dump([render(env, c) for c in cases], sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
