#!/usr/bin/env python3
"""The multi-domain section of docs/accuracy.md (and the plot's data) from
the echo-eval runs of scripts/accuracy-domains.sh.

    accuracy_domains_report.py OUT.md PLOT.dat RUNDIR...

Each RUNDIR holds DOMAIN.json (echo-eval --json against exact on that
domain's prompts). Rows are (run, mode, codec, G); per domain and pooled over
the domains a row covers: perplexity, next-token accuracy, the change against
exact with its paired standard error, top-1 agreement and mean KL. Pooled:
token-weighted means (perplexity: exp of the weighted mean log), and the
standard error sqrt(sum (n_d se_d)^2) / N (the domains' prompts are
disjoint). The section replaces the block between the markers in OUT.md, or
goes before its "## One answer per path" section."""
import json
import math
import os
import sys

DOMAINS = ["prose", "reference", "code", "german", "chat"]
BEGIN, END = "<!-- accuracy-domains:begin -->", "<!-- accuracy-domains:end -->"


def pooled(cells):
    n = sum(c["n"] for c in cells)
    return {
        "n": n,
        "ppl": math.exp(sum(c["n"] * math.log(c["ppl"]) for c in cells) / n),
        "acc": sum(c["n"] * c["acc"] for c in cells) / n,
        "d": sum(c["n"] * c["d"] for c in cells) / n if "d" in cells[0] else None,
        "se": math.sqrt(sum((c["n"] * c["se"]) ** 2 for c in cells)) / n if "se" in cells[0] else None,
        "top1": sum(c["n"] * c["top1"] for c in cells) / n if "top1" in cells[0] else None,
        "kl": sum(c["n"] * c["kl"] for c in cells) / n if "kl" in cells[0] else None,
    }


def main():
    md, dat, rundirs = sys.argv[1], sys.argv[2], sys.argv[3:]
    rows = {}  # key (run, mode, codec, G, tail calls) -> {domain: cell}
    meta = {}
    tags = {os.path.basename(rd.rstrip("/")) for rd in rundirs}
    # rows of runs not given here stay as OUT.md's table has them (their
    # JSON may be gone: the runs of earlier commits)
    old = open(md).read() if os.path.exists(md) else ""
    if BEGIN in old:
        for line in old[old.index(BEGIN):old.index(END)].splitlines():
            f = [x.strip() for x in line.strip().strip("|").split("|")]
            if len(f) != 10 or f[0] in tags or f[0] in ("run", "---") or f[3] not in DOMAINS:
                continue
            tag, name, bits, d = f[0], f[1], float(f[2]), f[3]
            if name == "exact":
                k = (tag, "exact", "-", 0, 0)
            else:
                mode, rest = name.split(" ", 1)
                cg = rest.split(" ")[0]
                tail = int(rest.split("last ")[1].split(" ")[0]) if "last " in rest else 0
                k = (tag, mode, cg.rsplit("-g", 1)[0], int(cg.rsplit("-g", 1)[1]), tail)
            c = {"n": int(f[4]), "ppl": float(f[5]), "acc": float(f[6].rstrip(" %")) / 100}
            if name != "exact":
                dd, se = f[7].replace(" pt", "").split(" ± ")
                c.update({"d": float(dd), "se": float(se), "top1": float(f[8].rstrip(" %")) / 100, "kl": float(f[9])})
            rows.setdefault(k, {})[d] = c
            meta[k] = {"bits": bits, "prompts": int(f[4]) // 255}
    for rd in rundirs:
        tag = os.path.basename(rd.rstrip("/"))
        for d in DOMAINS:
            p = os.path.join(rd, f"{d}.json")
            if not os.path.exists(p) or os.path.getsize(p) == 0:
                continue
            j = json.load(open(p))
            n = j["tokens_scored"]
            ex = rows.setdefault((tag, "exact", "-", 0, 0), {})
            ex[d] = {"n": n, "ppl": j["exact"]["ppl"], "acc": j["exact"]["next_token_acc"]}
            meta[(tag, "exact", "-", 0, 0)] = {"bits": 32, "prompts": j["prompts"]}
            for r in j["modes"]:
                k = (tag, r["mode"], r["codec"], r["group"], r.get("tail_sites", 0))
                rows.setdefault(k, {})[d] = {"n": n, "ppl": r["ppl"], "acc": r["next_token_acc"],
                                             "d": r["next_token_acc_delta_pt"], "se": r["next_token_acc_delta_se_pt"],
                                             "top1": r["top1_agreement"], "kl": r["kl_mean"]}
                meta[k] = {"bits": r["bits_per_value"], "prompts": j["prompts"], "allreduce": r.get("allreduce", "")}
    L = [BEGIN, "## Five kinds of text (issue 30): the multi-domain suite", ""]
    L.append("SmolLM2-135M-Instruct at tp 3 (threads), teacher-forced on five kinds of held-out text from pinned "
             "Debian 12 packages, fetched at run time (`apt-get download NAME=VERSION`, sha256-checked, unpacked "
             "with `dpkg-deb -x` under `build/accuracy-domains/`): **prose** = the Python 3.11 tutorial "
             "(`python3.11-doc` 3.11.2-6+deb12u9, reST reduced to paragraphs), **reference** = the library "
             "reference's reST sources as they are (same package), **code** = the standard library's own top-level "
             "`.py` files (`libpython3.11-stdlib` 3.11.2-6+deb12u9), **german** = German man pages, section 1 "
             "(`manpages-de` 4.18.1-1, rendered by groff), **chat** = the Python FAQ's question/answer pairs as "
             "user/assistant turns, three pairs per conversation, rendered by SmolLM2's own chat template "
             "(echo-serve's `/tokenize`, the jinja path); for chat every token of the rendering is scored "
             "(template tokens and both roles alike). Each domain's prompts are consecutive 256-token windows "
             "from the start of its text (255 predictions scored each).")
    L.append("")
    L.append("Reproduce: `scripts/accuracy-domains.sh --prompts 40 --modes echo --tag main` (the default preset, "
             "10,200 tokens per domain: since the tail policy, hout2-g128 with feedback and the last 2 calls of a "
             "pass in bf16); run `notail` is the same command on commit 565c26b, the preset before the tail "
             "(today `ECHO_TAIL=0 scripts/accuracy-domains.sh ...` gives it); "
             "`scripts/accuracy-domains.sh --prompts 8 --modes echo,echo-nofb,int4 "
             "--codecs hout2-g128 --tag ablation` on 565c26b (the same first 8 prompts of every domain: the "
             "error-feedback ablation and the paper's codec, all without the tail), then "
             "`python3 scripts/accuracy_domains_report.py docs/accuracy.md build/accuracy-domains/plot.dat "
             "build/accuracy-domains/runs/main` (the rows of runs not named are kept from the page) and "
             "`gnuplot -e \"dat='build/accuracy-domains/plot.dat'; out='docs/accuracy-domains.png'\" "
             "scripts/accuracy-domains.gp`. ± is the paired standard error of the accuracy change; pooled rows "
             "weigh domains by tokens.")
    L.append("")
    L.append("| run | all-reduce | bits/value | domain | tokens | perplexity | next-token acc | Δ vs exact | "
             "top-1 = exact | mean KL |")
    L.append("|---|---|---|---|---|---|---|---|---|---|")
    order = sorted(rows, key=lambda k: (k[0] != "main", k[1] != "exact", -meta[k]["bits"], k[1], k[2]))
    plot = []
    verdict = {}
    for k in order:
        cells = rows[k]
        tag, mode, codec, g, tail = k
        name = "exact" if mode == "exact" else f"{mode} {codec}-g{g}" + (f" + last {tail} bf16" if tail else "")
        doms = [d for d in DOMAINS if d in cells]
        for d in doms + (["**pooled**"] if len(doms) > 1 else []):
            c = cells[d] if d in cells else pooled([cells[x] for x in doms])
            dd = "–" if c.get("d") is None else f"{c['d']:+.2f} ± {c['se']:.2f} pt"
            t1 = "–" if c.get("top1") is None else f"{100 * c['top1']:.1f} %"
            kl = "–" if c.get("kl") is None else f"{c['kl']:.3f}"
            L.append(f"| {tag} | {name} | {round(meta[k]['bits'], 3):g} | {d} | {c['n']} | {c['ppl']:.3f} | "
                     f"{100 * c['acc']:.2f} % | {dd} | {t1} | {kl} |")
            # a row of the main run is not drawn again from another run
            dup = tag != "main" and ("main", mode, codec, g, tail) in rows
            if mode != "exact" and not dup:
                di = DOMAINS.index(d) if d in DOMAINS else len(DOMAINS)
                plot.append((meta[k]["bits"], c["d"], c["se"], di, int(mode in ("echo", "echo3")), f"{mode}/{codec}", tag))
                verdict[(tag, mode, codec, g, tail, d)] = c
    L.append("")
    # the done-when, from the rows
    v = []
    dflt = [k for k in rows if k[0] == "main" and k[1] == "echo"]
    for k in dflt:
        doms = [d for d in DOMAINS if d in rows[k]]
        p = pooled([rows[k][d] for d in doms])
        worst = min(doms, key=lambda d: rows[k][d]["d"])
        ok_p = p["d"] >= -0.4 and p["se"] <= 0.15 and p["n"] >= 50000
        ok_d = rows[k][worst]["d"] >= -0.6
        tl = f", the last {k[4]} calls of a pass bf16, {meta[k]['bits']:.3f} bits/value" if k[4] else ""
        v.append(f"- Default preset (`echo`, {k[2]}-g{k[3]}, feedback{tl}): pooled over {p['n']} tokens "
                 f"{p['d']:+.2f} ± {p['se']:.2f} pt — {'**holds**' if ok_p else '**does not hold**'} "
                 f"(≤ 0.4 pt lost, SE ≤ 0.15, ≥ 50,000 tokens); worst domain {worst} "
                 f"{rows[k][worst]['d']:+.2f} ± {rows[k][worst]['se']:.2f} pt — "
                 f"{'**holds**' if ok_d else '**does not hold**'} (≤ 0.6 pt on every domain).")
    # every row with feedback at <= 3.5 bits/value (over a pass, the tail counted)
    for k in rows:
        if k[1] in ("echo", "echo3") and meta[k]["bits"] <= 3.5 + 1e-9:
            doms = [d for d in DOMAINS if d in rows[k]]
            p = pooled([rows[k][d] for d in doms])
            tl = f", the last {k[4]} calls bf16" if k[4] else ""
            v.append(f"- ≤ 3.5-bit preset (`{k[1]}` {k[2]}-g{k[3]}, feedback{tl}, {meta[k]['bits']:.3f} bits/value), "
                     f"run {k[0]}: pooled over {p['n']} tokens "
                     f"{p['d']:+.2f} ± {p['se']:.2f} pt — "
                     f"{'**holds**' if p['d'] >= -1.0 else '**does not hold**'} (≤ 1.0 pt lost).")
    L += v + ["", "![Δ vs bits/value per domain](accuracy-domains.png)", "", END]
    text = open(md).read() if os.path.exists(md) else ""
    block = "\n".join(L)
    if BEGIN in text and END in text:
        a, b = text.index(BEGIN), text.index(END) + len(END)
        text = text[:a] + block + text[b:]
    elif "## One answer per path" in text:
        a = text.index("## One answer per path")
        text = text[:a] + block + "\n\n" + text[a:]
    else:
        text += "\n" + block + "\n"
    open(md, "w").write(text)
    with open(dat, "w") as f:
        f.write("# bits delta_pt se_pt domain_index feedback label run\n")
        for b, d, se, di, fb, lab, tag in plot:
            f.write(f"{b:.4f} {d:.4f} {se:.4f} {di} {fb} {lab} {tag}\n")
    print("\n".join(v), file=sys.stderr)


if __name__ == "__main__":
    main()
