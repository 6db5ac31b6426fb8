#!/usr/bin/env python3
"""What ptxas gives each CUDA kernel, per architecture; fails on spills.

Compiles each kernel source given to a cubin per architecture with
`nvcc --resource-usage` and the build's device-code options (device code
only, so it needs no
GPU) and prints, for each kernel, its registers per thread, static shared
memory, stack frame and spilled bytes. A kernel that spills registers to
local memory on either architecture fails the check: every kernel declares
__launch_bounds__ (tests/emu/translate.py enforces it), so ptxas knows the
largest block and spills only when the kernel needs more registers than that
block may have, a slowdown that no emulator run shows. A stack frame without
spills (a local array indexed at run time) is reported, not failed.

  tests/gpu/resources.py --nvcc PATH --archs "80 90" --flags "-O3 ..." [--jobs N] FILE.cu ...

Exit status: 0 clean, 1 a kernel spills, 2 nvcc failed or printed nothing.
Run through `make check-cuda-resources`, which passes the Makefile's
NVCC_ARCHS, NVCC_OPT and kernel sources (part of `make test` when nvcc is
present, and a step of tests/gpu/run.sh).
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile

ENTRY = re.compile(r"Compiling entry function '(\S+)' for 'sm_(\d+)'")
FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
USED = re.compile(r"Used (\d+) registers(?:, used \d+ barriers)?(?:, (\d+) bytes smem)?")


def compile_one(nvcc, flags, src, arch, tmp):
    out = os.path.join(tmp, "%s.sm_%s.cubin" % (os.path.basename(src), arch))
    cmd = [nvcc] + flags + ["-cubin", "-arch=sm_" + arch, "-I.", "--resource-usage", src, "-o", out]
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return src, arch, p.returncode, p.stdout


def parse(text):
    """ptxas output -> {(mangled, arch): {reg, smem, stack, spill_st, spill_ld}}"""
    rows, cur = {}, None
    for line in text.splitlines():
        m = ENTRY.search(line)
        if m:
            cur = (m.group(1), m.group(2))
            rows[cur] = {"reg": 0, "smem": 0, "stack": 0, "spill_st": 0, "spill_ld": 0}
            continue
        if cur is None:
            continue
        m = FRAME.search(line)
        if m:
            rows[cur].update(stack=int(m.group(1)), spill_st=int(m.group(2)), spill_ld=int(m.group(3)))
        m = USED.search(line)
        if m:
            rows[cur].update(reg=int(m.group(1)), smem=int(m.group(2) or 0))
    return rows


def demangle(names):
    tool = shutil.which("c++filt")
    if not tool or not names:
        return {n: n for n in names}
    p = subprocess.run([tool], input="\n".join(names), stdout=subprocess.PIPE, text=True)
    out = p.stdout.splitlines()
    if len(out) != len(names):
        return {n: n for n in names}
    # drop the parameter list: the template arguments name the instance
    return {n: re.sub(r"\(.*$", "", d).replace("void ", "", 1) for n, d in zip(names, out)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nvcc", required=True)
    ap.add_argument("--archs", required=True, help="compute capabilities, e.g. \"80 90\"")
    ap.add_argument("--flags", required=True, help="device-code options of the build, e.g. \"-O3 -std=c++17\"")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--known-spills", default="",
                    help="comma-separated kernel names whose spills are known and accepted (untuned kernels, "
                         "listed with why in the Makefile); each may spill at most --known-max bytes")
    ap.add_argument("--known-max", type=int, default=128)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    archs, flags = a.archs.split(), shlex.split(a.flags)
    if not os.path.exists(a.nvcc) and not shutil.which(a.nvcc):
        print("resources.py: no nvcc at %s" % a.nvcc, file=sys.stderr)
        return 2
    rows, failed_compile = {}, []
    with tempfile.TemporaryDirectory(prefix="echo-res.") as tmp:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, a.jobs)) as ex:
            jobs = [ex.submit(compile_one, a.nvcc, flags, f, arch, tmp) for f in a.files for arch in archs]
            for j in jobs:
                src, arch, rc, text = j.result()
                if rc != 0:
                    failed_compile.append("%s sm_%s: %s" % (src, arch, text.strip()[-400:]))
                    continue
                for k, v in parse(text).items():
                    v["src"] = src
                    rows[k] = v
    if failed_compile:
        print("resources.py: nvcc failed:\n  " + "\n  ".join(failed_compile), file=sys.stderr)
        return 2
    if not rows:
        print("resources.py: ptxas reported no kernel (is --resource-usage supported?)", file=sys.stderr)
        return 2
    names = demangle(sorted({k for k, _ in rows}))
    spills, known = [], []
    allowed = {k for k in a.known_spills.split(",") if k}
    print("%-42s %-5s %4s %6s %5s %s" % ("kernel", "arch", "regs", "smem", "stack", "spill st/ld (bytes)"))
    for (mangled, arch), v in sorted(rows.items(), key=lambda kv: (names[kv[0][0]], kv[0][1])):
        name = names[mangled]
        print("%-42s sm_%s %4d %6d %5d %d/%d" % (name[:42], arch, v["reg"], v["smem"], v["stack"], v["spill_st"],
                                                  v["spill_ld"]))
        if v["spill_st"] or v["spill_ld"]:
            line = "%s (%s) on sm_%s: %d bytes spill stores, %d bytes spill loads" % (
                name, v["src"], arch, v["spill_st"], v["spill_ld"])
            base = name.split("<")[0].split("(")[0]
            if base in allowed and max(v["spill_st"], v["spill_ld"]) <= a.known_max:
                known.append(line)
            else:
                spills.append(line)
    nk = len({k for k, _ in rows})
    if known:
        print("\nknown spills (--known-spills, at most %d bytes each; tune these kernels):\n  %s" %
              (a.known_max, "\n  ".join(known)))
    if spills:
        print("\nFAIL: %d kernel instance(s) spill registers to local memory:\n  %s" % (len(spills), "\n  ".join(spills)))
        print("(lower the kernel's __launch_bounds__ if its launches use smaller blocks, or cut its live registers)")
        return 1
    print("\nresources: %d kernel instances x %d architectures, no spills%s; most registers %d (%s)" %
          (nk, len(archs), " beyond the %d known" % len(known) if known else "", max(v["reg"] for v in rows.values()),
           names[max(rows.items(), key=lambda kv: kv[1]["reg"])[0][0]]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
