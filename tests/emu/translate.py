#!/usr/bin/env python3
"""Rewrite a CUDA source into C++ the emulator compiles (tests/emu).

Only what g++ cannot parse, or would give host semantics, is rewritten; the
rest of the file is compiled as it is, against tests/emu/include:
  kernel<<<grid, block[, smem[, stream]]>>>(args)
      -> (emu::Launcher(__FILE__, __LINE__, "kernel", ID, grid, block...)
             ->* [](auto... a) { kernel(a...); })(args)
     ID is &kernel, which keys cudaFuncSetAttribute's shared-memory limit,
     or nullptr for a template kernel whose arguments are deduced at the call
     (it cannot be named without them; such kernels use no opt-in).
  extern __shared__ [__align__(n)] T name[];
      -> T *name = (T *)emu::dyn_smem();
  __shared__ [__align__(n)] T a[N][M], b;
      -> T (&a)[N][M] = *(T (*)[N][M])emu::block_shared(...); T &b = ...;
     storage per block, fresh garbage for each block, overruns seen by ASan
and one statement is added: every kernel definition must declare
__launch_bounds__(MAX[, ...]) (so ptxas sizes its registers for its largest
block, and a launch beyond it is refused on a GPU), and gets
emu::launch_bounds(__FILE__, __LINE__, MAX); as its first statement, which
aborts a launch of more than MAX threads per block. A kernel without
__launch_bounds__ stops the translation.
A #line directive keeps diagnostics and __FILE__ pointing at the original.
Usage: translate.py IN.cu OUT.cpp   (or IN.h OUT.h for a header of device code)
"""
import re
import sys

src_path, out_path = sys.argv[1], sys.argv[2]
s = open(src_path).read()

# kernels declared as templates: `template <...> [comment] __global__ void [__launch_bounds__(..)] name(`
template_kernels = set(re.findall(
    r'template\s*<[^<>]*>\s*(?:/\*.*?\*/\s*)?__global__\s+void\s+(?:__launch_bounds__\s*\([^()]*\)\s*)?(\w+)\s*\(',
    s, flags=re.S))


def launch(m):
    name, cfg = m.group(1), m.group(2)
    base = re.match(r'\w+', name).group(0)
    explicit = '<' in name
    ident = 'nullptr' if (base in template_kernels and not explicit) else '(const void *)&%s' % name
    # keep the line count: newlines inside the match move to the end
    nl = (m.group(0).count('\n'))
    cfg1 = ' '.join(cfg.split())
    return ('(emu::Launcher(__FILE__, __LINE__, "%s", %s, %s) ->* [](auto... emu_a) { %s(emu_a...); })'
            % (name.replace('"', ''), ident, cfg1, name)) + '\n' * nl


def closing(text, i):
    """Index of the parenthesis closing the one at text[i]."""
    depth = 0
    for j in range(i, len(text)):
        if text[j] == '(':
            depth += 1
        elif text[j] == ')':
            depth -= 1
            if depth == 0:
                return j
    sys.exit('translate.py: %s: unbalanced parentheses after offset %d' % (src_path, i))


def first_arg(text):
    """The first argument of __launch_bounds__(MAX, MIN_BLOCKS, ...)."""
    depth = 0
    for j, c in enumerate(text):
        if c == '(':
            depth += 1
        elif c == ')':
            depth -= 1
        elif c == ',' and depth == 0:
            return text[:j].strip()
    return text.strip()


def add_bounds_checks(text):
    """Insert the launch-bounds check into every kernel definition."""
    out, pos = [], 0
    for m in re.finditer(r'__global__\s+void\s+', text):
        i = m.end()
        bound = None
        lb = re.match(r'__launch_bounds__\s*\(', text[i:])
        if lb:
            open_at = i + lb.end() - 1
            close_at = closing(text, open_at)
            bound = first_arg(text[open_at + 1:close_at])
            i = close_at + 1
        nm = re.match(r'\s*(\w+)\s*\(', text[i:])
        if not nm:
            sys.exit('translate.py: %s: cannot read the kernel name after __global__ at offset %d' % (src_path, m.start()))
        name = nm.group(1)
        params_close = closing(text, i + nm.end() - 1)
        body = re.match(r'\s*(?:/\*.*?\*/\s*)*\{', text[params_close + 1:], flags=re.S)
        if not body:
            continue  # a declaration, not a definition
        if bound is None:
            line = text.count('\n', 0, m.start()) + 1
            sys.exit('translate.py: %s:%d: kernel %s has no __launch_bounds__: every kernel declares its largest '
                     'block (ptxas then keeps its registers within one block of that size)' % (src_path, line, name))
        brace = params_close + 1 + body.end()
        out.append(text[pos:brace])
        out.append(' emu::launch_bounds(__FILE__, __LINE__, (long)(%s));' % bound)
        pos = brace
    out.append(text[pos:])
    return ''.join(out)


def split_top(text):
    """Split a declarator list at the commas outside brackets and parentheses."""
    parts, depth, start = [], 0, 0
    for j, c in enumerate(text):
        if c in '([':
            depth += 1
        elif c in ')]':
            depth -= 1
        elif c == ',' and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:])
    return [p.strip() for p in parts]


def static_shared(m):
    """`__shared__ [__align__(n)] T a[..], b;` -> references into emu::block_shared storage."""
    align = m.group(2) or '0'
    decls = split_top(m.group(3))
    first = re.match(r'^(.*?)\s*\b(\w+)\s*((?:\[[^\]]*\]\s*)*)$', decls[0], flags=re.S)
    if not first or not first.group(1).strip():
        sys.exit('translate.py: %s: cannot read the __shared__ declaration "%s"' % (src_path, m.group(0)))
    ctype = first.group(1).strip()
    items = [(first.group(2), first.group(3))]
    for d in decls[1:]:
        dm = re.match(r'^(\w+)\s*((?:\[[^\]]*\]\s*)*)$', d)
        if not dm:
            sys.exit('translate.py: %s: cannot read the __shared__ declarator "%s"' % (src_path, d))
        items.append((dm.group(1), dm.group(2)))
    out = []
    for name, dims in items:
        dims = ''.join(dims.split())
        full = '%s%s' % (ctype, dims)  # the variable's type, e.g. float[4][32]
        ref = '%s (&%s)%s' % (ctype, name, dims) if dims else '%s &%s' % (ctype, name)
        ptr = '(%s (*)%s)' % (ctype, dims) if dims else '(%s *)' % ctype
        out.append('%s = *%semu::block_shared(__FILE__, __LINE__, "%s", sizeof(%s), %s);'
                   % (ref, ptr, name, full, align))
    return ' '.join(out) + '\n' * m.group(0).count('\n')


s = add_bounds_checks(s)
s = re.sub(r'([A-Za-z_]\w*(?:\s*<[^<>;()]*>)?)\s*<<<(.*?)>>>', launch, s, flags=re.S)
s = re.sub(
    r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([\w\s\*]+?)\s*(\w+)\s*\[\s*\]\s*;',
    lambda m: '%s *%s = (%s *)emu::dyn_smem();' % (m.group(1), m.group(2), m.group(1)), s)
# declarations that begin a line (so a comment that names __shared__ is left alone)
s = re.sub(r'(?m)^([ \t]*)__shared__\s+(?:__align__\s*\(\s*(\d+)\s*\)\s*)?([^;]*);',
           lambda m: m.group(1) + static_shared(m), s)
if '<<<' in s or '>>>' in s:
    sys.exit('translate.py: %s: a launch was not rewritten' % src_path)
if re.search(r'extern\s+__shared__', s):
    sys.exit('translate.py: %s: an extern __shared__ declaration was not rewritten' % src_path)
if re.search(r'(?m)^[ \t]*__shared__\b', s):
    sys.exit('translate.py: %s: a __shared__ declaration was not rewritten' % src_path)
with open(out_path, 'w') as f:
    f.write('#line 1 "%s"\n' % src_path)
    f.write(s)
