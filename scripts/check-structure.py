#!/usr/bin/env python3
"""The codebase's shape, checked (issue 46's "Done when"):

  1. no circle of calls between files of one folder (from the built objects'
     symbol tables: file A calls file B when A's object needs a symbol B's
     defines), except the Jinja evaluator <-> its filters;
  2. no product function over 150 lines (C and CUDA sources of the product's
     folders and tools/, a function being a column-0 definition whose
     signature ends in '{', up to the next column-0 '}');
  3. engine/engine.h declares at most 15 functions.

usage: scripts/check-structure.py [--obj build/obj] [--quiet]
Exit status 1 when any of them is broken; every violation is printed."""
import collections, os, re, subprocess, sys

ALLOWED_CIRCLES = [{'tokenizer/jinja_eval', 'tokenizer/jinja_filters'}]
PRODUCT = ['comm', 'engine', 'grammar', 'kernels', 'model', 'server',
           'tokenizer', 'tools', 'weights']
MAX_LINES, MAX_ENGINE_FNS = 150, 15
# Known and not yet split (issue 46 stays open for it): the tiled prefill
# attention kernel, one CUDA kernel that needs a GPU or the emulator to split
# safely. A name listed here that is no longer long is an error too.
KNOWN_LONG = {('kernels/cuda/cuda_attention.cu', '__launch_bounds__')}


def call_graph(obj_root):
    defs, uses = {}, collections.defaultdict(set)
    for d, _, fs in os.walk(obj_root):
        rel = os.path.relpath(d, obj_root)
        if rel.split(os.sep)[0] not in PRODUCT or rel.startswith('tools'):
            continue
        for f in fs:
            if not f.endswith('.o'):
                continue
            name = os.path.join(rel, f[:-2])
            out = subprocess.run(['nm', os.path.join(d, f)], capture_output=True,
                                 text=True, check=True).stdout
            for line in out.splitlines():
                p = line.split()
                if len(p) == 3 and p[1] in 'TDBRV':
                    defs.setdefault(p[2], name)
                elif len(p) == 2 and p[0] == 'U':
                    uses[name].add(p[1])
    edges = {a: {defs[s] for s in syms if s in defs and defs[s] != a}
             for a, syms in uses.items()}
    return defs, uses, edges


def circles(edges):
    """Strongly connected components (Tarjan) of the same-folder edges."""
    folder = os.path.dirname
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if folder(w) != folder(v):
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def long_functions():
    files = subprocess.run(['git', 'ls-files'] + [f'{p}/*.c' for p in PRODUCT] +
                           [f'{p}/*.cu' for p in PRODUCT], capture_output=True,
                           text=True, check=True).stdout.split()
    head = re.compile(r'^[A-Za-z_][^;]*\(')  # a column-0 line opening a parameter list
    found = []
    for path in files:
        lines = open(path, encoding='utf-8', errors='replace').read().split('\n')
        i = 0
        while i < len(lines):
            ln = lines[i]
            if head.match(ln) and not ln.startswith(('typedef', 'struct', 'enum', 'union', '#')):
                k = i  # the signature may run over several lines, up to the one ending in '{'
                while k < len(lines) and k < i + 8 and ';' not in lines[k] and not lines[k].rstrip().endswith('{'):
                    k += 1
                if k < len(lines) and k < i + 8 and ';' not in lines[k] and lines[k].rstrip().endswith('{'):
                    j = k + 1
                    while j < len(lines) and lines[j] != '}':
                        j += 1
                    name = re.search(r'([A-Za-z_]\w*)\s*\(', ln)
                    if j - i + 1 > MAX_LINES:
                        found.append((j - i + 1, path, i + 1, name.group(1) if name else '?'))
                    i = j
            i += 1
    return sorted(found, reverse=True)


def engine_functions(path='engine/engine.h'):
    text = re.sub(r'/\*.*?\*/', '', open(path).read(), flags=re.S)
    text = re.sub(r'//[^\n]*', '', text)
    text = re.sub(r'\{[^{}]*\}', '{}', text)  # struct bodies (one level)
    text = re.sub(r'\{[^{}]*\}', '{}', text)
    decls = re.findall(r'^[A-Za-z_][^;{}#]*?\b([A-Za-z_]\w*)\s*\([^;{}]*\)\s*;', text, flags=re.M)
    return [d for d in decls if not d.startswith('typedef')]


def main():
    obj = 'build/obj'
    if '--obj' in sys.argv:
        obj = sys.argv[sys.argv.index('--obj') + 1]
    if not os.path.isdir(obj):
        sys.exit(f'check-structure: {obj} does not exist: run make all first')
    bad = 0
    defs, uses, edges = call_graph(obj)
    for comp in circles(edges):
        if any(comp == a for a in ALLOWED_CIRCLES):
            continue
        bad += 1
        print('circle:', ' '.join(sorted(comp)))
        for a in sorted(comp):
            for b in sorted(edges.get(a, ())):
                if b in comp:
                    syms = sorted(s for s in uses[a] if defs.get(s) == b)
                    print(f'    {a} -> {b}: {" ".join(syms[:5])}' + (' ...' if len(syms) > 5 else ''))
    longs = long_functions()
    for n, path, line, name in longs:
        if (path, name) in KNOWN_LONG:
            print(f'known long function (not yet split): {path}:{line} {n} lines')
            continue
        bad += 1
        print(f'long function: {path}:{line} {name} is {n} lines (at most {MAX_LINES})')
    for path, name in KNOWN_LONG - {(p, nm) for _, p, _, nm in longs}:
        bad += 1
        print(f'{path} {name} is no longer long: drop it from KNOWN_LONG')
    fns = engine_functions()
    if len(fns) > MAX_ENGINE_FNS:
        bad += 1
        print(f'engine/engine.h declares {len(fns)} functions (at most {MAX_ENGINE_FNS}): {" ".join(fns)}')
    print(f'check-structure: {bad} violation(s)')
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
