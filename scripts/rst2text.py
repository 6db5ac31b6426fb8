#!/usr/bin/env python3
"""Plain English paragraphs from reStructuredText sources (the Python
tutorial), for accuracy measurements: directives, literal blocks, doctest
lines and section underlines dropped; inline roles and markup reduced to
their text; paragraphs of fewer than 8 words skipped."""
import re
import sys

ROLE = re.compile(r':[a-z:]+:`~?([^`<]*?)(?:\s*<[^>]*>)?`')


def paragraphs(text):
    para, skip = [], False
    for ln in text.split('\n'):
        s = ln.rstrip()
        if skip:
            if s == '' or ln[:1] in (' ', '\t'):
                continue
            skip = False
        if s.startswith('..'):
            skip = True
            continue
        if re.fullmatch(r'[=\-~^*#"+`]{3,}', s.strip()) or ln[:1] in (' ', '\t') or s.startswith('>>>'):
            continue
        if s == '':
            if para:
                yield ' '.join(para)
                para = []
            continue
        if s.endswith('::'):
            s, skip = s[:-1], True
        s = ROLE.sub(r'\1', s)
        s = re.sub(r'``([^`]*)``', r'\1', s)
        s = re.sub(r'\*\*([^*]*)\*\*', r'\1', s)
        s = re.sub(r'`([^`<]*?)\s*(<[^>]*>)?`_+', r'\1', s)
        para.append(s.strip())
    if para:
        yield ' '.join(para)


def main():
    out = []
    for path in sorted(sys.argv[1:]):
        with open(path, encoding='utf-8') as f:
            out += [p for p in paragraphs(f.read()) if len(p.split()) >= 8]
    sys.stdout.write('\n\n'.join(out) + '\n')


if __name__ == '__main__':
    main()
