#!/usr/bin/env python3
"""Rewrite a CUDA source into C++ the emulator compiles (tests/emu).

Only the two constructs g++ cannot parse are rewritten; the rest of the
file is compiled as it is, against tests/emu/include:
  kernel<<<grid, block[, smem[, stream]]>>>(args)
      -> (emu::Launcher(__FILE__, __LINE__, "kernel", ID, grid, block...)
             ->* [](auto... a) { kernel(a...); })(args)
     ID is &kernel, which keys cudaFuncSetAttribute's shared-memory limit,
     or nullptr for a template kernel whose arguments are deduced at the call
     (it cannot be named without them; such kernels use no opt-in).
  extern __shared__ [__align__(n)] T name[];
      -> T *name = (T *)emu::dyn_smem();
A #line directive keeps diagnostics and __FILE__ pointing at the original.
Usage: translate.py IN.cu OUT.cpp
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


n_launch = 0


def launch_count(m):
    global n_launch
    n_launch += 1
    return launch(m)


s = re.sub(r'([A-Za-z_]\w*(?:\s*<[^<>;()]*>)?)\s*<<<(.*?)>>>', launch_count, s, flags=re.S)
s, n_ext = re.subn(
    r'extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?([\w\s\*]+?)\s*(\w+)\s*\[\s*\]\s*;',
    lambda m: '%s *%s = (%s *)emu::dyn_smem();' % (m.group(1), m.group(2), m.group(1)), s)
if '<<<' in s or '>>>' in s:
    sys.exit('translate.py: %s: a launch was not rewritten' % src_path)
if re.search(r'extern\s+__shared__', s):
    sys.exit('translate.py: %s: an extern __shared__ declaration was not rewritten' % src_path)
with open(out_path, 'w') as f:
    f.write('#line 1 "%s"\n' % src_path)
    f.write(s)
