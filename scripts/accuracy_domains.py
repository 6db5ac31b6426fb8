#!/usr/bin/env python3
"""The held-out texts of the multi-domain accuracy suite
(scripts/accuracy-domains.sh), from the extracted Debian packages under ROOT.

    accuracy_domains.py ROOT OUTDIR

Writes OUTDIR/{prose,reference,code,german}.txt and OUTDIR/chat.json (a list
of conversations, each a list of {"role","content"} messages, for the
model's chat template):
  prose      the Python 3.11 tutorial, reST reduced to paragraphs (rst2text.py)
  reference  the library reference's reST sources as they are (markup, lists,
             code names, literal blocks)
  code       the standard library's own .py files (top level, sorted by name)
  german     German man pages (manpages-de, section 1), rendered by groff
  chat       the Python FAQ: each question (a section title ending in '?')
             a user turn, its answer the assistant turn, three pairs per
             conversation"""
import glob
import gzip
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rst2text import paragraphs  # noqa: E402

UNDER = re.compile(r'[=\-~^*#"+`]{3,}')


def faq_pairs(path):
    """(question, answer) of every section titled with a question."""
    lines = open(path, encoding="utf-8").read().split("\n")
    heads = [i for i in range(len(lines) - 1)
             if lines[i].strip() and UNDER.fullmatch(lines[i + 1].strip())
             and len(lines[i + 1].strip()) >= len(lines[i].strip())]
    out = []
    for k, i in enumerate(heads):
        q = lines[i].strip()
        if not q.endswith("?"):
            continue
        end = heads[k + 1] if k + 1 < len(heads) else len(lines)
        a = "\n\n".join(paragraphs("\n".join(lines[i + 2:end])))
        q = re.sub(r'``([^`]*)``', r'\1', q)
        if a.strip():
            out.append((q, a))
    return out


def main():
    root, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    src = f"{root}/usr/share/doc/python3.11/html/_sources"
    tut = sorted(glob.glob(f"{src}/tutorial/*.rst.txt"))
    with open(f"{out}/prose.txt", "w", encoding="utf-8") as f:
        for p in tut:
            for para in paragraphs(open(p, encoding="utf-8").read()):
                if len(para.split()) >= 8:
                    f.write(para + "\n\n")
    with open(f"{out}/reference.txt", "w", encoding="utf-8") as f:
        for p in sorted(glob.glob(f"{src}/library/*.rst.txt")):
            f.write(open(p, encoding="utf-8").read().strip() + "\n\n")
    with open(f"{out}/code.txt", "w", encoding="utf-8") as f:
        for p in sorted(glob.glob(f"{root}/usr/lib/python3.11/*.py")):
            if not os.path.isfile(p):  # a link to another package's file
                continue
            f.write(f"# {os.path.basename(p)}\n" + open(p, encoding="utf-8", errors="replace").read().strip() + "\n\n")
    with open(f"{out}/german.txt", "w", encoding="utf-8") as f:
        env = dict(os.environ, LC_ALL="C.UTF-8")
        n = 0
        for p in sorted(glob.glob(f"{root}/usr/share/man/de/man1/*.1.gz")):
            roff = gzip.open(p).read()
            r = subprocess.run(["groff", "-k", "-man", "-Tutf8", "-P", "-cbou", "-rLL=100n"], input=roff,
                               capture_output=True, env=env, timeout=60)
            t = re.sub(r"\n{3,}", "\n\n", r.stdout.decode("utf-8", "replace")).strip()
            if r.returncode == 0 and t:
                f.write(t + "\n\n")
                n += len(t)
            if n > 400000:  # enough for any run of this suite
                break
    pairs = []
    for p in sorted(glob.glob(f"{src}/faq/*.rst.txt")):
        pairs += faq_pairs(p)
    convs = [[m for q, a in pairs[i:i + 3] for m in ({"role": "user", "content": q},
                                                      {"role": "assistant", "content": a})]
             for i in range(0, len(pairs), 3)]
    json.dump(convs, open(f"{out}/chat.json", "w"), ensure_ascii=False)
    for d in ("prose", "reference", "code", "german"):
        print(f"accuracy_domains: {d}: {os.path.getsize(f'{out}/{d}.txt')} bytes", file=sys.stderr)
    print(f"accuracy_domains: chat: {len(pairs)} FAQ pairs in {len(convs)} conversations", file=sys.stderr)


if __name__ == "__main__":
    main()
